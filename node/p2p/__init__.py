"""Networking: libp2p host (TCP + Noise + Yamux), framed msgpack request/response, gossipsub, and the limits on
what a peer may send.

* :mod:`~node.p2p.host` -- ``P2PHost``: the host, its lifecycle, addresses, dialling and peer slots, with
  :mod:`~node.p2p.streams` (serving and asking request/response streams; ``PeerUnreachable``) and
  :mod:`~node.p2p.gossip` mixed in; :mod:`~node.p2p.quirks` -- work-arounds for py-libp2p 0.8.1.
* :mod:`~node.p2p.framing` -- the wire format, errors and reply convention; :mod:`~node.p2p.gossip` -- gossip
  semantics and de-duplication.
* :mod:`~node.p2p.wirelimits` -- every protocol's request/reply limits and the node-wide read pool;
  :mod:`~node.p2p.budget` -- reply bytes in flight per peer and node-wide; :mod:`~node.p2p.filesend` and
  :mod:`~node.p2p.filerecv` -- bulk replies streamed from and to disk; :mod:`~node.p2p.scoring` -- misbehaviour
  scores.

Importing this package does not import py-libp2p; starting a host does. The host uses :mod:`node.net`'s admission,
addresses, limits and logs (the two packages import each other: docs/architecture.md).
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
