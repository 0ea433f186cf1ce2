"""Tally across machines: addresses, the genesis handshake, reachability, relays, peer discovery and limits."""
