"""The hostile-peer suite's fast smoke test (default suite): a nested-map bomb on the hello before the
handshake, then an idle-socket flood, against a real target node while an honest client on another /24
generates; each followed by check 5 (fresh peers connect, ping and say hello)."""

from __future__ import annotations

import pytest


# ~90 s with its devnet: the default suite must stay under 15 min; the slow step runs it with the security suite
@pytest.mark.slow
def test_hello_bomb_then_idle_flood(devnet):
    v = devnet.play("bomb", "--phase", "pre", "--protocols", "/tally/hello/1.0.0", "--kinds", "empty_maps",
                    "wide_array", "--size", str(8 << 20), "--streams", "4", seconds=6)
    print(v.summary())
    assert not v.problems(), v.summary()
    v = devnet.play("idle", "--sockets", "300", seconds=6)
    print(v.summary())
    assert not v.problems(), v.summary()
