"""Tally across machines: the genesis handshake, reachability, relays and peer discovery, on top of the libp2p
host of :mod:`node.p2p` (which holds the policy below the host: addresses, admission, limits, quiet logs).

* Dialling: :mod:`~node.net.dial` (which addresses to dial, raced), :mod:`~node.net.paths` (per-peer paths and the
  network view), :mod:`~node.net.peers` (the address book).
* :mod:`~node.net.hello` (peers of another genesis refused).
* :mod:`~node.net.reachability` (dialable from outside?), :mod:`~node.net.relay` (circuit relay v2, hole punching).
* :mod:`~node.net.service` -- the network service that runs them on one host.

This package imports :mod:`node.p2p`; :mod:`node.p2p` never imports it.
"""
