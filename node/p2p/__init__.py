"""Networking: libp2p host (TCP + Noise + Yamux), framed msgpack request/response, gossipsub.

See :mod:`node.p2p.host` (``P2PHost``), :mod:`node.p2p.framing` (wire format, errors, reply convention) and
:mod:`node.p2p.gossip` (gossip semantics). Importing this package does not import py-libp2p; starting a host does.
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
