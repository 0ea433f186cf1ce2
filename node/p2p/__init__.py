"""Networking: libp2p host (TCP + Noise + Yamux), framed msgpack request/response, gossipsub, and the limits on
what a peer may send.

* :mod:`~node.p2p.host` -- ``P2PHost``: the host, its lifecycle, addresses and peer slots, with
  :mod:`~node.p2p.streams` (serving and asking request/response streams; ``PeerUnreachable``),
  :mod:`~node.p2p.dialing` (dialling peers, remembering their addresses) and :mod:`~node.p2p.gossip` mixed in;
  :mod:`~node.p2p.quirks` -- work-arounds for py-libp2p 0.8.1.
* :mod:`~node.p2p.framing` -- the wire format, errors and reply convention; :mod:`~node.p2p.gossip` -- gossip
  semantics, de-duplication and counters; :mod:`~node.p2p.gossipsub` -- py-libp2p's router settings and pubsub
  patches.
* :mod:`~node.p2p.wirelimits` -- every protocol's request/reply limits and the node-wide read pool;
  :mod:`~node.p2p.budget` -- reply bytes in flight per peer and node-wide; :mod:`~node.p2p.filesend` and
  :mod:`~node.p2p.filerecv` -- bulk replies streamed from and to disk; :mod:`~node.p2p.scoring` -- misbehaviour
  scores.
* Below the host, pure policy it applies: :mod:`~node.p2p.addrs` (which addresses a node listens on and
  announces), :mod:`~node.p2p.admission` (inbound connections capped before any handshake),
  :mod:`~node.p2p.listener_guard` (refusal in the accept loop), :mod:`~node.p2p.shun` and
  :mod:`~node.p2p.synfilter` (a churning source's SYNs dropped in the kernel), :mod:`~node.p2p.limits` (per-peer
  connection and stream limits; what they need of the host is the ``Penalizer`` protocol), :mod:`~node.p2p.logs`
  (py-libp2p's records routed, failure reasons spelled out).

Importing this package does not import py-libp2p; starting a host does. Nothing here imports :mod:`node.net`,
which builds on the host (the genesis handshake, reachability, relays, discovery).
"""

from .framing import (
                      FrameError,
                      RemoteError,
                      RequestTimeout,
                      StreamClosed,
                      check_reply,
                      error_reply,
                      ok_reply,
                      read_msg,
                      write_msg,
)
from .host import P2PHost, PeerUnreachable

__all__ = [
                      "FrameError",
                      "P2PHost",
                      "PeerUnreachable",
                      "RemoteError",
                      "RequestTimeout",
                      "StreamClosed",
                      "check_reply",
                      "error_reply",
                      "ok_reply",
                      "read_msg",
                      "write_msg",
]
