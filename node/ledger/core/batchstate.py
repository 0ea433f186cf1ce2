"""The ledger records of batch jobs (values only; the state machine is :mod:`node.ledger.core.batch`).

Tables (:mod:`node.ledger.core.records`): ``batches`` (batch id -> :class:`Batch`), ``batch_items``
(:func:`item_key` -> :class:`Item`, created when an item is first assigned), ``batch_due`` (:func:`due_key` -> 0:
the items to decide, in height order), ``batch_workers`` (account -> :class:`WorkerRecord`) and the set
``open_batches`` (ids of the batches not yet terminal), reached from any state by :func:`open_batches`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .batchtx import BatchPost
from .kv import OrderedSet
from .view import StateView


class BatchStatus(str, enum.Enum):
    OPEN = "open"  # posted; no item assigned yet (cancellable)
    RUNNING = "running"  # some item assigned; not every item decided
    SETTLED = "settled"  # every item decided; unspent escrow returned
    CANCELLED = "cancelled"


TERMINAL = {BatchStatus.SETTLED, BatchStatus.CANCELLED}


class ItemStatus(str, enum.Enum):
    ASSIGNED = "assigned"  # an attempt is in its commit or reveal window
    ACCEPTED = "accepted"  # a quorum of equal results: ``Item.result``
    REFUNDED = "refunded"  # no quorum after every re-issue (or no fresh worker left): its escrow returned


class AuditStatus(str, enum.Enum):
    """A decided item's committee audit (:mod:`node.ledger.core.batchaudit`)."""

    NONE = "none"  # not sampled (or no committee could be drawn)
    OPEN = "open"  # the committee is re-running it
    UPHELD = "upheld"  # the committee's quorum computed the accepted result
    OVERTURNED = "overturned"  # it computed another: the agreeing workers were slashed, its result replaced
    UNDECIDED = "undecided"  # no quorum of the committee: nothing moved


class Fate(str, enum.Enum):
    """What one assigned worker's attempt came to (``Item.history``)."""

    AGREED = "agreed"  # revealed the quorum's result: paid ``price``
    DISSENTED = "dissented"  # revealed another result than the quorum's: bond slashed
    UNREVEALED = "unrevealed"  # committed, never revealed: absent penalty
    ABSENT = "absent"  # never committed: absent penalty
    NO_QUORUM = "no_quorum"  # revealed, but no result reached the quorum: neither paid nor penalised
    OVERRULED = "overruled"  # agreed on a result an audit overturned: bond slashed (it keeps the price)
    VINDICATED = "vindicated"  # dissented with the result an audit found: its slash returned from the treasury


def item_key(batch_id: bytes, item: int) -> bytes:
    """``batch_items`` key: the 16-byte batch id, then the item index as 4 big-endian bytes."""
    return batch_id + item.to_bytes(4, "big")


def due_key(height: int, batch_id: bytes, item: int) -> bytes:
    """``batch_due`` key: the decision height as 8 big-endian bytes (so the table iterates in height order), then
    :func:`item_key`."""
    return height.to_bytes(8, "big") + item_key(batch_id, item)


@dataclass(frozen=True)
class Batch:
    """Ledger state of one batch. ``assigned``: items ``0..assigned-1`` have an :class:`Item`; ``decided``,
    ``accepted``: counts of decided and accepted items; ``escrow_left``: base units still in the requester's escrow
    for this batch; ``paid``: paid to agreeing workers; ``slashed``: taken from dissenting, absent and overruled
    workers' bonds (to the treasury; less what vindicated dissenters got back); ``refunded``: returned to the
    requester; ``auditing``: items whose committee audit is open; ``overturned``: items an audit overturned."""

    post: BatchPost
    height: int
    status: BatchStatus = BatchStatus.OPEN
    assigned: int = 0
    decided: int = 0
    accepted: int = 0
    escrow_left: int = 0
    paid: int = 0
    slashed: int = 0
    refunded: int = 0
    final_height: int = 0
    auditing: int = 0
    overturned: int = 0

    def to_dict(self) -> dict[Any, Any]:
        p = self.post
        return {"batch_id": p.batch_id, "post": p.to_wire(), "height": self.height, "status": self.status.value,
                "assigned": self.assigned, "decided": self.decided, "accepted": self.accepted,
                "escrow_left": self.escrow_left, "paid": self.paid, "slashed": self.slashed,
                "refunded": self.refunded, "final_height": self.final_height, "auditing": self.auditing,
                "overturned": self.overturned}


@dataclass(frozen=True)
class Item:
    """One item's current attempt. ``workers``: drawn for this attempt (rank order); ``quorum``: equal reveals needed
    (``quorum`` of the post, lowered with ``len(workers)`` by adaptive replication); ``assigned_height``: the block
    whose ``end_block`` drew them (commits from the next block on); ``due``: the height whose ``end_block`` decides
    it; ``commits``: ``(worker, commitment)``; ``reveals``: ``(worker, result hash)``; ``tried``: every worker of
    earlier attempts (never drawn again for this item); ``history``: ``(attempt, worker, Fate, base units moved)``
    of decided attempts (paid for AGREED, taken for DISSENTED / UNREVEALED / ABSENT); ``result``: the accepted
    result hash; ``agreed``: the workers that revealed it (after an overturning audit: the vindicated dissenters and
    the committee members that computed it); ``audit``, ``audit_committee``, ``audit_votes`` (``(member, result
    hash)``), ``audit_due``: its committee audit (:mod:`node.ledger.core.batchaudit`)."""

    attempt: int
    assigned_height: int
    due: int
    workers: tuple[bytes, ...]
    quorum: int
    status: ItemStatus = ItemStatus.ASSIGNED
    commits: tuple[tuple[bytes, bytes], ...] = ()
    reveals: tuple[tuple[bytes, bytes], ...] = ()
    tried: tuple[bytes, ...] = ()
    history: tuple[tuple[int, bytes, Fate, int], ...] = ()
    result: bytes = b""
    agreed: tuple[bytes, ...] = ()
    decided_height: int = 0
    audit: AuditStatus = AuditStatus.NONE
    audit_committee: tuple[bytes, ...] = ()
    audit_votes: tuple[tuple[bytes, bytes], ...] = ()
    audit_due: int = 0

    def commitment_of(self, worker: bytes) -> bytes | None:
        return next((c for w, c in self.commits if w == worker), None)

    def to_dict(self) -> dict[Any, Any]:
        return {"attempt": self.attempt, "assigned_height": self.assigned_height, "due": self.due,
                "workers": list(self.workers), "quorum": self.quorum, "status": self.status.value,
                "commits": [list(c) for c in self.commits], "reveals": [list(r) for r in self.reveals],
                "tried": list(self.tried), "history": [[a, w, f.value, x] for a, w, f, x in self.history],
                "result": self.result, "agreed": list(self.agreed), "decided_height": self.decided_height,
                "audit": self.audit.value, "audit_committee": list(self.audit_committee),
                "audit_votes": [list(v) for v in self.audit_votes], "audit_due": self.audit_due}


@dataclass(frozen=True)
class WorkerRecord:
    """A worker's batch reputation: ``agreed``, results that matched a quorum (ever); ``run``, consecutive ones (reset
    by a dissent or an absence); ``held``, assignments not yet decided (an unbond waits for them); ``missed``,
    consecutive absences (never committed or never revealed; reset by any reveal), which shrink the worker's limit
    of undecided assignments (:func:`node.ledger.core.batchrules.held_limit`); ``offer``, the floor of its live
    :class:`~node.ledger.core.batchtx.BatchOffer` in base units per token (-1: no offer, never drawn); as a
    requester, ``open_items``, the items of its batches not yet settled or cancelled (genesis
    ``batch_max_open_items`` caps them)."""

    agreed: int = 0
    run: int = 0
    held: int = 0
    missed: int = 0
    offer: int = -1
    open_items: int = 0


def open_batches(s: StateView) -> OrderedSet[bytes]:
    """The ids of the batches of ``s`` not yet terminal, in the order they were opened (the ``open_batches``
    set)."""
    return s.ordered("open_batches")
