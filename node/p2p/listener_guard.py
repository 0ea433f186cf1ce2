"""Refusal of raw inbound TCP connections inside the listener's accept loop, before any trio task is spawned
(issue 23, "Limits before the handshake"; check 3 under connection churn).

py-libp2p 0.8.1 serves a TCP listen address with ``trio.serve_listeners`` (``libp2p/transport/tcp/tcp.py``,
``TCPListener.listen``): every accepted socket gets its own handler task, a ``TrioTCPStream`` and py-libp2p's
connection wrappers before Tally's admission (:mod:`node.p2p.admission`) can look at its address. A peer that
reconnects as fast as it is refused (~1,600 connections/s from one process on loopback) then costs the node a task
spawn, those wrappers and two closes per connection: 0.83 cores against 0.28 without the churn (``bench/attack.py``,
class ``idle``, before this module).

:func:`guard_listeners` replaces the ``accept`` method of each ``trio.SocketListener`` of one swarm's TCP listeners
(an attribute of that listener object only: several hosts in one process keep their own admissions) with a loop
that accepts the raw socket, asks the swarm's :class:`~node.p2p.admission.Admission` about its remote address, and

* refuses synchronously, without a task or a stream object: ``SO_LINGER`` 0, then ``close`` (the kernel answers
  with RST, so no ``TIME_WAIT`` state is kept for a connection we never wanted);
* admits by returning the ``trio.SocketStream`` to ``trio.serve_listeners``, which spawns the handler task as
  before; the connection's :class:`~node.p2p.admission.Ticket` is handed to that task through :func:`take_ticket`.

A source refused too often (:mod:`node.p2p.shun`: 64 refusals within a second, by default) is shunned for a while:
the guard attaches a socket filter to each listening socket that drops its SYNs in the kernel
(:mod:`node.p2p.synfilter`), so a churn that goes on costs the node no accept at all; the accept loop's wait is
bounded by the next shun's end, when the filter is attached again without it.

trio's own ``SocketListener.accept`` semantics are kept: ``EBADF`` becomes ``trio.ClosedResourceError``, the errnos
trio ignores on accept are retried, other ``OSError`` s (``EMFILE``...) propagate to ``serve_listeners``, which
backs off. Each accept is a trio checkpoint (``trio.socket`` ``accept`` yields), so a flood of refusals cannot
starve the node's other tasks.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket as stdlib_socket
import struct
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import trio

from . import synfilter
from .shun import ShunList


class Gate(Protocol):
    """What the guard needs of the swarm's admission (:class:`node.p2p.admission.Admission`): a decision per
    remote address (an opaque ticket, or None for a refusal) and its shun list. Declared here, by the consumer,
    so that the admission may import the guard without a cycle."""

    shun: ShunList

    def accept(self, ip: str | None) -> object | None: ...

log = logging.getLogger(__name__)

_LINGER_RST = struct.pack("ii", 1, 0)  # struct linger {l_onoff = 1, l_linger = 0}: close() sends RST

# the accept errnos trio's SocketListener retries (trio/_highlevel_socket.py, _ignorable_accept_errno_names)
_IGNORABLE_ACCEPT = {getattr(errno, n) for n in ("EPERM", "ECONNABORTED", "EPROTO", "ENETDOWN", "ENOPROTOOPT",
                                                 "EHOSTDOWN", "ENONET", "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH")
                     if hasattr(errno, n)}


def reset_close(sock: Any) -> None:
    """Close ``sock`` (a trio or stdlib socket) with an RST instead of a FIN; never raises."""
    with contextlib.suppress(OSError):
        sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_LINGER, _LINGER_RST)
    with contextlib.suppress(OSError):
        sock.close()


class ListenerGuard:
    """The accept-loop admission of one swarm (see the module doc).

    Args:
        admission: returns the swarm's current :class:`~node.p2p.admission.Admission` (looked up per accept, so
            that :func:`node.p2p.admission.install` may replace it).

    Attributes:
        refused_in_accept: connections refused in the accept loop (also counted in the admission's ``refused``).
        guarded: the ``trio.SocketListener`` objects whose ``accept`` this guard replaced.
    """

    def __init__(self, admission: Callable[[], Gate]):
        self.admission = admission
        self.refused_in_accept = 0
        self.guarded: weakref.WeakSet[Any] = weakref.WeakSet()
        # admitted stream -> its ticket, until the handler task takes it (weak: a stream dropped unhandled frees it)
        self._tickets: weakref.WeakKeyDictionary[Any, object] = weakref.WeakKeyDictionary()
        self._filter_state: tuple[int, int] = (0, 0)  # (id of the ShunList, its version) last attached

    def _sync_filter(self) -> float | None:
        """End the admission's due shuns and, if its set of shunned prefixes changed since the last sync, attach
        the new SYN filter (:mod:`node.p2p.synfilter`) to every guarded listener's socket. Returns the seconds
        until the next shun ends (None: none left), which bounds the accept loop's wait."""
        shun = self.admission().shun
        wait = shun.expire()
        state = (id(shun), shun.version)
        if state != self._filter_state:
            prefixes = shun.prefixes()
            for listener in list(self.guarded):
                if not synfilter.attach(listener.socket, prefixes):
                    break  # no socket filters here: refusals stay in the accept loop
            if prefixes:
                log.info("shunned %d source(s): their SYNs are dropped for up to %.0f s (%s)", len(prefixes),
                         shun.policy.seconds, ", ".join(str(p) for p in prefixes[:4]))
            self._filter_state = state
        return wait

    def take_ticket(self, stream: Any) -> object | None:
        """The ticket taken in the accept loop for ``stream`` (a ``trio.SocketStream``), once; None when the
        stream did not come through a guarded listener (then the caller asks the admission itself)."""
        try:
            return self._tickets.pop(stream, None)
        except TypeError:  # None, or another object that cannot be weakly referenced: not one of ours
            return None

    def guard(self, listener: Any) -> bool:
        """Replace ``listener.accept`` (a ``trio.SocketListener``) with the admitting loop; False (and nothing
        done) for any other kind of listener or one already guarded."""
        if not isinstance(listener, trio.SocketListener) or listener in self.guarded:
            return False
        sock = listener.socket
        self._sync_filter()  # a listener started while sources are shunned drops their SYNs too

        async def accept() -> trio.SocketStream:
            while True:
                wait = self._sync_filter()
                try:
                    conn = None
                    with trio.move_on_after(wait if wait is not None else math.inf):
                        conn, addr = await sock.accept()
                    if conn is None:
                        continue  # a shun ended: the filter is synced at the top of the loop
                except OSError as exc:
                    if exc.errno == errno.EBADF:
                        raise trio.ClosedResourceError from None
                    if exc.errno not in _IGNORABLE_ACCEPT:
                        raise
                    continue
                ip = addr[0] if isinstance(addr, tuple) and addr else None
                ticket = self.admission().accept(ip)
                if ticket is None:
                    self.refused_in_accept += 1
                    reset_close(conn)
                    continue  # and if that refusal shunned its source, the filter is synced at the loop's top
                stream = trio.SocketStream(conn)
                self._tickets[stream] = ticket
                return stream

        listener.accept = accept  # type: ignore[method-assign]  # this listener object only, on purpose
        self.guarded.add(listener)
        return True


def guard_listeners(network: Any, guard: ListenerGuard) -> int:
    """Guard every ``trio.SocketListener`` of ``network``'s (a py-libp2p 0.8.1 ``Swarm``) TCP listeners not yet
    guarded; the number newly guarded. Listeners of other transports (whose accept is not a ``SocketListener``)
    are left alone: the swarm's inbound handler still admits their connections."""
    n = 0
    for tl in list(getattr(network, "listeners", {}).values()):
        for sl in list(getattr(tl, "listeners", ()) or ()):
            n += guard.guard(sl)
    return n
