"""The hostile-peer suite (issue 23, checks 1, 3 and 5): attacks played by separate processes against real
``node start`` processes on loopback, while an honest client from another address generates."""
