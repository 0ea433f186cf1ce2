"""Work-arounds for py-libp2p 0.8.1 behaviour, kept in one place (see docs in each function)."""

from __future__ import annotations

import logging
import os
import socket


def route_libp2p_logging(level: int = logging.WARNING) -> None:
    """Send py-libp2p's ``libp2p.*`` records through the application's logging config.

    At import py-libp2p detaches its logger (``propagate=False``, no handler) unless ``LIBP2P_DEBUG`` is set, so
    its warnings reach stderr through ``logging.lastResort``. This re-attaches it at ``level``. No-op when
    ``LIBP2P_DEBUG`` is set (py-libp2p then logs to its own handlers).
    """
    if os.environ.get("LIBP2P_DEBUG"):
        return
    lg = logging.getLogger("libp2p")
    lg.propagate = True
    lg.setLevel(level)
    # this module forces INFO on itself and logs every 30 s and on each disconnect
    logging.getLogger("libp2p.network.auto_connector").setLevel(level)


def check_port_free(host: str, port: int) -> None:
    """py-libp2p listens with SO_REUSEPORT, so a second node on a busy port would start and silently share
    it. Probe with a plain socket first (SO_REUSEADDR only, so TIME_WAIT leftovers do not count).

    Raises:
        OSError: the port is in use.
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        family, _, _, _, addr = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None


def exception_leaves(eg: BaseExceptionGroup) -> list[BaseException]:
    """All non-group exceptions inside ``eg`` (trio nurseries wrap even a single error in a group)."""
    out: list[BaseException] = []
    for e in eg.exceptions:
        out.extend(exception_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def batch_yamux_window_updates() -> None:
    """py-libp2p 0.8.1's Yamux sends a WINDOW_UPDATE frame after every read by default
    (``PY_YAMUX_RELEASE_ON_READ=1``): one extra encrypted frame, and a socket write, per message received. With it
    off, updates follow go-yamux's hysteresis (one update per half window consumed), which cuts the frames of a
    request/response exchange of small messages by about 40 %. An explicit setting in the environment wins.
    Read by py-libp2p at each use, so calling this before the host starts is enough."""
    os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")
