"""A node's own pending transactions (issue 28): the outbox file that keeps its wallet's accepted transactions over
a crash, and the schedule on which it re-sends every local transaction still pending.

Pure bookkeeping and file I/O; :class:`~node.ledger.service.LedgerService` owns one of each, feeds them the
mempool's local transactions (:meth:`~node.ledger.mempool.Mempool.local`) and does the sending.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..encoding import DecodeError, pack, unpack
from .core.tx import Tx, decode_tx
from .mempool_policy import Priority, priority

log = logging.getLogger("tally.ledger")

RESEND_FIRST = 2.0  # seconds from a local submission (or a reconnect, a catch-up, a restart) to its first re-send
RESEND_MAX = 60.0  # seconds: the longest wait between two re-sends of a transaction still pending (doubling)
RESEND_BATCH = 32  # transactions re-sent per look (the oldest due first)
OUTBOX_MAX_TXS = 1024  # local account transactions kept on disk while pending (beyond: not kept over a crash)
OUTBOX_MAX_BYTES = 4 << 20  # bytes of the outbox file (msgpack list of transaction wire forms)


def outbox_path(store: object) -> Path | None:
    """``<ledger dir>.outbox``: beside the LevelDB directory of ``store`` (a
    :class:`~node.ledger.store.LedgerStore`); None for a store without a path."""
    name = getattr(getattr(store, "db", None), "name", None)
    if not name:
        return None
    p = Path(name.decode() if isinstance(name, bytes) else name)
    return p.parent / (p.name + ".outbox")


class Outbox:
    """The account transactions (a wallet's: transfers, bonds...) this node accepted from local callers and that
    are still queued, in a file rewritten whole (tmp file, fsync, rename) whenever they change, so that a crash
    loses none of them. At most :data:`OUTBOX_MAX_TXS` transactions and :data:`OUTBOX_MAX_BYTES` bytes.

    Args:
        path: the file (:func:`outbox_path`); None keeps nothing.
    """

    def __init__(self, path: Path | None):
        self.path = path
        self.ids: frozenset[bytes] = frozenset()  # what the file holds now

    def save(self, local: Iterable[Tx]) -> None:
        """Write the ACCOUNT-class transactions of ``local`` (in order); a write error is logged, not raised."""
        if self.path is None:
            return
        wires: list[dict[Any, Any]] = []
        ids: list[bytes] = []
        size = 0
        for tx in local:
            if priority(tx) is not Priority.ACCOUNT:
                continue
            w = tx.to_wire()
            n = len(pack(w))
            if len(wires) >= OUTBOX_MAX_TXS or size + n > OUTBOX_MAX_BYTES:
                log.warning("outbox full: %d transactions, %d bytes; later ones are not kept over a crash",
                            len(wires), size)
                break
            wires.append(w)
            ids.append(tx.id)
            size += n
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(pack(wires))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot write the outbox %s: %s", self.path, e)
            return
        self.ids = frozenset(ids)

    def load(self) -> list[Tx]:
        """The transactions the file holds (decoded and size-checked, signatures not checked: the mempool does).
        A missing file is no error; an unreadable one, or an undecodable entry, is logged and skipped."""
        if self.path is None or not self.path.exists():
            return []
        try:
            with open(self.path, "rb") as f:
                raw = f.read(OUTBOX_MAX_BYTES + 1)
            wires = unpack(raw, max_size=OUTBOX_MAX_BYTES)
            if not isinstance(wires, list):
                raise DecodeError("the outbox is not a list")
        except (OSError, DecodeError) as e:
            log.warning("ignoring the outbox %s: %s", self.path, e)
            return []
        out = []
        for w in wires[:OUTBOX_MAX_TXS]:
            try:
                out.append(decode_tx(w))
            except (DecodeError, ValueError, TypeError) as e:
                log.warning("outbox entry skipped: %s", e)
        return out


@dataclass
class _Turn:
    at: float  # time.monotonic() seconds of the next re-send
    delay: float = RESEND_FIRST  # the wait after that one
    count: int = 0  # re-sends so far


class ResendSchedule:
    """When each local pending transaction is next re-sent: :data:`RESEND_FIRST` after it is queued, then after
    waits doubling to :data:`RESEND_MAX`; everything pending at once (and the waits reset) after a catch-up or a
    newly connected validator; at most :data:`RESEND_BATCH` a look."""

    def __init__(self) -> None:
        self._turns: dict[bytes, _Turn] = {}

    def add(self, tid: bytes, at: float) -> None:
        """Schedule ``tid``'s first re-send at ``at`` (``time.monotonic`` seconds) unless it is scheduled."""
        self._turns.setdefault(tid, _Turn(at))

    def count(self, tid: bytes) -> int:
        """Times ``tid`` was re-sent (0 when unknown)."""
        t = self._turns.get(tid)
        return 0 if t is None else t.count

    def forget_except(self, queued: set[bytes]) -> list[tuple[bytes, int]]:
        """Forget every transaction not in ``queued``; returns ``(id, re-sends)`` of those forgotten."""
        gone = [(tid, t.count) for tid, t in self._turns.items() if tid not in queued]
        for tid, _ in gone:
            del self._turns[tid]
        return gone

    def due(self, local: list[Tx], now: float, all_now: bool) -> list[Tx]:
        """Which of ``local`` (oldest first) to re-send at ``now``; each is rescheduled. ``all_now``: a catch-up or
        a new validator connection: every one is due, with its wait back at :data:`RESEND_FIRST`."""
        out: list[Tx] = []
        for tx in local:
            t = self._turns.setdefault(tx.id, _Turn(now))
            if all_now:
                t.at, t.delay = now, RESEND_FIRST
            if t.at <= now and len(out) < RESEND_BATCH:
                out.append(tx)
                t.count += 1
                t.at, t.delay = now + t.delay, min(RESEND_MAX, t.delay * 2)
        return out


__all__ = ["OUTBOX_MAX_BYTES", "OUTBOX_MAX_TXS", "RESEND_BATCH", "RESEND_FIRST", "RESEND_MAX", "Outbox",
           "ResendSchedule", "outbox_path"]
