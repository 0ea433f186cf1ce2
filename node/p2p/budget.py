"""Budgets of reply bytes in flight, per peer and node-wide, for the protocols that send bulk replies (issue 23,
"Budgets for bulk replies").

A handler that is about to send a large reply (a model block, a batch item file, a snapshot chunk) first reserves
the bytes that reply will hold in memory while it is written::

    budget = ReplyBudget()                          # one per node, shared by every bulk protocol
    async with budget.reserve(peer, nbytes):        # waits at most budget.wait seconds, else raises Busy
        await write_msg(stream, reply, timeout=...)  # always under a write deadline

What to reserve: a reply built in memory holds its payload, the packed message and its frames, about 3x the
payload (reserve that *before* reading the payload); a file streamed from disk with
:func:`node.p2p.filesend.serve_file` holds one frame at a time and reserves
:data:`node.p2p.filesend.STREAM_HOLD` (2 MiB) whatever the file's size. So the caps bound the memory that replies
can pin, and with write deadlines, for how long.

While the block runs, ``nbytes`` count against ``peer`` and against the node. A reservation that does not fit
waits up to :attr:`ReplyBudget.wait` seconds for others to end, then raises :class:`Busy` (a
:class:`~node.p2p.framing.RemoteError` with code ``"busy"``: a request handler registered with
:meth:`~node.p2p.host.P2PHost.set_request_handler` turns it into the error reply ``{"status": "error", "code":
"busy"}`` by itself; a stream handler sends :func:`busy_reply`). The bytes come back when the block exits, by
return, error or cancellation (the release is synchronous, so no cancellation can skip it).

A reservation larger than the per-peer cap holds the whole cap instead: it is served only while its peer has
nothing else in flight (and the node has room for a cap), never refused outright for its size alone.

The counters (:meth:`ReplyBudget.stats`) are for ``/metrics`` and the node's status: bytes in flight, replies in
flight, replies granted, and refusals split by the cap that refused them.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from .framing import RemoteError, error_reply

__all__ = ["NODE_WIDE", "PER_PEER", "WAIT", "Busy", "Cap", "ReplyBudget", "Reservation", "busy_reply"]

PER_PEER = 32 << 20  # bytes of replies in flight to one peer, by default
NODE_WIDE = 256 << 20  # bytes of replies in flight to all peers together, by default
WAIT = 2.0  # seconds a reservation waits for room before it is refused, by default
BUSY = "busy"  # error code of a refused reservation


class Cap(enum.Enum):
    """Which limit refused a reservation."""

    PEER = "peer"
    NODE = "node"


class Busy(RemoteError):
    """A reservation found no room within its wait: the reply is refused with code ``"busy"`` (the requester
    may try again later or ask another peer). ``.cap`` says which limit was full."""

    def __init__(self, cap: Cap, message: str):
        super().__init__(BUSY, message)
        self.cap = cap


def busy_reply(e: Busy) -> dict[str, Any]:
    """The error reply for a refused reservation: ``{"status": "error", "code": "busy", "message": ...}``."""
    return error_reply(e.code, e.message)


@dataclass(frozen=True)
class Reservation:
    """Bytes held by one reply: ``peer`` (peer ID), ``nbytes`` (what was asked), ``held`` (what counts against
    the caps: ``nbytes`` clamped to them)."""

    peer: str
    nbytes: int
    held: int


class ReplyBudget:
    """Bytes of replies in flight, per peer and node-wide.

    Args:
        per_peer: bytes one peer may have in flight (default :data:`PER_PEER`, 32 MiB).
        node_wide: bytes all peers together may have in flight (default :data:`NODE_WIDE`, 256 MiB).
        wait: seconds :meth:`reserve` waits for room before raising :class:`Busy` (default :data:`WAIT`).

    Raises:
        ValueError: a cap below 1 byte, ``per_peer`` above ``node_wide``, or a negative wait.

    Not thread-safe: use it from one trio loop (the node's).
    """

    def __init__(self, per_peer: int = PER_PEER, node_wide: int = NODE_WIDE, wait: float = WAIT):
        if per_peer < 1 or node_wide < 1 or per_peer > node_wide:
            raise ValueError(f"caps must satisfy 1 <= per_peer ({per_peer}) <= node_wide ({node_wide})")
        if wait < 0:
            raise ValueError(f"wait must be >= 0 seconds, not {wait}")
        self.per_peer = per_peer
        self.node_wide = node_wide
        self.wait = wait
        self._by_peer: dict[str, int] = {}  # peer -> bytes held (no entry at 0: nothing outlives its replies)
        self._replies: dict[str, int] = {}  # peer -> replies in flight
        self._total = 0
        self._changed = trio.Event()  # set (and replaced) at every release: waiters check again
        self.granted = 0  # reservations granted since start
        self.refused = {Cap.PEER: 0, Cap.NODE: 0}  # reservations refused since start, by the cap that was full

    # ------------------------------------------------------------------ queries

    @property
    def in_flight(self) -> int:
        """Bytes held by all replies now."""
        return self._total

    def held_by(self, peer: str) -> int:
        """Bytes held by ``peer``'s replies now."""
        return self._by_peer.get(peer, 0)

    def whole(self) -> bool:
        """True when nothing is held (every reservation has been given back)."""
        return self._total == 0 and not self._by_peer and not self._replies

    def stats(self) -> dict[str, int]:
        """Counters for ``/metrics`` and status: ``in_flight_bytes``, ``in_flight_replies``, ``peers``,
        ``granted``, ``refused_peer``, ``refused_node``, ``per_peer``, ``node_wide`` (bytes)."""
        return {"in_flight_bytes": self._total, "in_flight_replies": sum(self._replies.values()),
                "peers": len(self._by_peer), "granted": self.granted, "refused_peer": self.refused[Cap.PEER],
                "refused_node": self.refused[Cap.NODE], "per_peer": self.per_peer, "node_wide": self.node_wide}

    def _full(self, peer: str, held: int) -> Cap | None:
        if self._by_peer.get(peer, 0) + held > self.per_peer:
            return Cap.PEER
        if self._total + held > self.node_wide:
            return Cap.NODE
        return None

    # ------------------------------------------------------------------ reserve / release

    def try_reserve(self, peer: str, nbytes: int) -> Reservation:
        """Take ``nbytes`` (clamped to the caps) for ``peer`` now, without waiting; give them back with
        :meth:`release`. Prefer :meth:`reserve`, which cannot leak.

        Raises:
            Busy: no room now. ValueError: ``nbytes`` < 0.
        """
        if nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes} bytes")
        held = min(nbytes, self.per_peer)
        cap = self._full(peer, held)
        if cap is not None:
            self.refused[cap] += 1
            raise Busy(cap, self._why(cap, peer, nbytes))
        self._take(peer, held)
        return Reservation(peer, nbytes, held)

    def release(self, r: Reservation) -> None:
        """Give back what :meth:`try_reserve` took (synchronous: safe in a ``finally`` of a cancelled task)."""
        left = self._by_peer.get(r.peer, 0) - r.held
        if left < 0 or self._replies.get(r.peer, 0) < 1:
            raise RuntimeError(f"release of a reservation not held by {r.peer}")
        if left:
            self._by_peer[r.peer] = left
        else:
            del self._by_peer[r.peer]
        n = self._replies[r.peer] - 1
        if n:
            self._replies[r.peer] = n
        else:
            del self._replies[r.peer]
        self._total -= r.held
        self._changed.set()  # wake every waiter: each checks again whether it fits
        self._changed = trio.Event()

    @asynccontextmanager
    async def reserve(self, peer: str, nbytes: int, wait: float | None = None) -> AsyncIterator[Reservation]:
        """Hold ``nbytes`` (clamped to the caps) for ``peer`` while the ``async with`` block runs.

        Args:
            peer: the requester's peer ID.
            nbytes: the reply's size in bytes (>= 0).
            wait: seconds to wait for room (default :attr:`wait`); 0 refuses at once when full.

        Raises:
            Busy: no room within ``wait`` seconds (code ``"busy"``; ``.cap`` says which limit). Counted in
                :attr:`refused`.
            ValueError: ``nbytes`` < 0.
        """
        if nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes} bytes")
        held = min(nbytes, self.per_peer)
        deadline = trio.current_time() + (self.wait if wait is None else wait)
        while (cap := self._full(peer, held)) is not None:
            changed = self._changed
            with trio.move_on_at(deadline):
                await changed.wait()
            if trio.current_time() >= deadline and self._full(peer, held) is not None:
                self.refused[cap] += 1
                raise Busy(cap, self._why(cap, peer, nbytes))
        r = Reservation(peer, nbytes, held)
        self._take(peer, held)
        try:
            yield r
        finally:
            self.release(r)

    def _take(self, peer: str, held: int) -> None:
        self._by_peer[peer] = self._by_peer.get(peer, 0) + held
        self._replies[peer] = self._replies.get(peer, 0) + 1
        self._total += held
        self.granted += 1

    def _why(self, cap: Cap, peer: str, nbytes: int) -> str:
        if cap is Cap.PEER:
            return (f"{self._by_peer.get(peer, 0)} bytes of replies to this peer in flight, a reply of "
                    f"{nbytes} bytes would pass the per-peer cap of {self.per_peer}; try again later")
        return (f"{self._total} bytes of replies in flight, a reply of {nbytes} bytes would pass the "
                f"node-wide cap of {self.node_wide}; try again later")

