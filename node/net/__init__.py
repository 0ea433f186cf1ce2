"""Tally across machines: addresses, admission, the genesis handshake, reachability, relays, peer discovery and
limits, on top of the libp2p host of :mod:`node.p2p`.

* Addresses and dialling: :mod:`~node.net.addrs` (which addresses a node listens on and announces),
  :mod:`~node.net.dial` (which to dial, raced), :mod:`~node.net.paths` (per-peer paths and the network view),
  :mod:`~node.net.peers` (the address book).
* Before and at the handshake: :mod:`~node.net.admission` (inbound connections capped before any handshake),
  :mod:`~node.net.listener_guard` (refusal in the accept loop), :mod:`~node.net.shun` and
  :mod:`~node.net.synfilter` (a churning source's SYNs dropped in the kernel), :mod:`~node.net.hello` (peers of
  another genesis refused), :mod:`~node.net.limits` (per-peer connection and stream limits).
* :mod:`~node.net.reachability` (dialable from outside?), :mod:`~node.net.relay` (circuit relay v2, hole punching).
* :mod:`~node.net.service` -- the network service that runs them on one host; :mod:`~node.net.logs` -- quiet logs.

:mod:`node.p2p.host` uses the admission, address, limit and log modules, and the service uses the host: the two
packages import each other (known debt, docs/architecture.md).
"""
