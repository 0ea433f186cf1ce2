"""Quiet logs for normal network behaviour (issue 25): py-libp2p's loggers routed, failure reasons spelled out.

Behind a NAT most dials fail, and that is normal: a peer's private address of another network, a relay's circuit
refused, a hole punch that a symmetric NAT defeats. py-libp2p 0.8.1 logs each of these at ERROR or WARNING
("Failed to open TCP stream: [Errno 101] Network is unreachable", "Error in DCUtR protocol ...") and a user saw a
terminal full of errors on a working swarm. :func:`install` routes every ``libp2p.*`` record through one handler
that

* demotes records about expected network events (:data:`EXPECTED`: unreachable networks, refused, reset or timed
  out connections, failed hole punches, relay streams a peer closed) to DEBUG;
* turns any other py-libp2p ERROR into a WARNING (py-libp2p logs a failure of one peer's stream at ERROR; the
  node itself goes on), keeping its text;
* passes what remains to the root logger's handlers, at the level configured for ``libp2p`` (WARNING by default).

Tally's own code logs an expected dial failure as one DEBUG line, a change of a peer's path or of our reachability
as one INFO line (:mod:`node.net.paths`, :mod:`node.net.service`), and gives every WARNING a reason with
:func:`reason` (never an empty ``TooSlowError:``).
"""

from __future__ import annotations

import logging
import os
import re

import trio

# text of py-libp2p records that describe normal behaviour of a network with NATs and unreachable peers
EXPECTED = re.compile("|".join([
    r"Failed to open TCP stream", r"Unexpected error opening TCP stream", r"Network is unreachable",
    r"Cannot assign requested address", r"Connection refused", r"No route to host", r"timed out",
    r"Connection reset", r"Broken pipe", r"[Tt]imeout", r"DCUtR", r"hole punch", r"direct connection",
    r"No direct addresses", r"hop stream", r"stop stream", r"relay(ing)? (data|connection)",
    r"destination stream", r"reservation", r"failed to upgrade", r"fail to upgrade", r"Failed to connect",
    r"[Dd]ial", r"unreachable", r"StreamReset", r"StreamEOF", r"stream (closed|reset)", r"Connection closed",
    r"IncompleteRead", r"EOF", r"negative cache", r"Failed to read DHT message", r"reading from stream",
    r"connect handler", r"status message", r"window update", r"Cannot flush pending messages",
    r"Failed to fetch stored addresses", r"Cannot write to stream", r"no stream available", r"Refusing HOP",
]), re.IGNORECASE)

_installed: logging.Handler | None = None


def reason(e: BaseException) -> str:
    """``"TypeName: message"`` for a log line, with a message even where the exception has none (a
    ``trio.TooSlowError`` says "no answer within the deadline", others their class's doc line)."""
    text = str(e).strip()
    if not text:
        if isinstance(e, trio.TooSlowError):
            text = "no answer within the deadline"
        elif isinstance(e, trio.Cancelled):
            text = "cancelled"
        else:
            doc = (type(e).__doc__ or "").strip().splitlines()
            text = doc[0] if doc else "no detail given"
    return f"{type(e).__name__}: {text}"


def classify(record: logging.LogRecord) -> int:
    """The level a py-libp2p ``record`` is shown at: DEBUG for :data:`EXPECTED` events at WARNING or above,
    WARNING for any other ERROR (or CRITICAL), its own level otherwise."""
    if record.levelno < logging.WARNING:
        return record.levelno
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose arguments do not format
        text = str(record.msg)
    if EXPECTED.search(text):
        return logging.DEBUG
    return logging.WARNING if record.levelno >= logging.ERROR else record.levelno


class _Route(logging.Handler):
    """Re-levels ``libp2p.*`` records (:func:`classify`) and hands them to the root logger's handlers."""

    def __init__(self, threshold: int):
        super().__init__(logging.NOTSET)
        self.threshold = threshold

    def emit(self, record: logging.LogRecord) -> None:
        level = classify(record)
        if level != record.levelno:
            record.levelno, record.levelname = level, logging.getLevelName(level)
        if level < self.threshold:
            return
        if level >= logging.WARNING:
            try:
                text = record.getMessage()
            except Exception:  # noqa: BLE001 - shown as py-libp2p made it
                text = None
            if text is not None and text.rstrip().endswith(":"):  # "...: " + an exception without a message
                record.msg, record.args = text.rstrip() + " (py-libp2p gave no reason)", ()
        logging.getLogger().handle(record)


def install(level: int = logging.WARNING) -> None:
    """Route py-libp2p's loggers as described in the module doc; idempotent.

    Args:
        level: the least level shown (after re-levelling); WARNING by default, DEBUG shows everything.

    With ``LIBP2P_DEBUG`` set nothing changes (py-libp2p then logs to its own handlers).
    """
    global _installed
    if os.environ.get("LIBP2P_DEBUG"):
        return
    lg = logging.getLogger("libp2p")
    if _installed is not None:
        lg.removeHandler(_installed)
    _installed = _Route(level)
    lg.addHandler(_installed)
    lg.propagate = False
    lg.setLevel(level)  # records below it are never shown (re-levelling only lowers), so never made
    # py-libp2p sets levels on some of its loggers itself (auto_connector forces INFO); let the route decide
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("libp2p."):
            child = logging.getLogger(name)
            child.setLevel(logging.NOTSET)
