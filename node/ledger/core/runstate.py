"""The ledger records of training runs (values only; the state machine is :mod:`node.ledger.core.runs`).

Tables (:mod:`node.ledger.core.records`): ``runs`` (run id -> :class:`Run`) and the insertion-ordered set
``open_runs`` (ids of the runs not yet terminal), both owned by the runs module; :func:`runs_of` and
:func:`open_runs` reach them from any state (:class:`node.ledger.core.view.StateView`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .kv import OrderedSet, Table
from .runtx import NO_MOMENTUM, RunPost
from .view import StateView

MAX_JOINED = 256


class RunStatus(str, enum.Enum):
    WAITING = "waiting"  # fewer than min_workers joined: no round open
    TRAINING = "training"
    FINISHING = "finishing"  # every round done (or the deadline passed): waiting for the last receipts' verdicts
    FINISHED = "finished"
    EXPIRED = "expired"  # the deadline passed before the last round; unspent escrow returned
    CANCELLED = "cancelled"


TERMINAL = {RunStatus.FINISHED, RunStatus.EXPIRED, RunStatus.CANCELLED}


class Phase(str, enum.Enum):
    COMMIT = "commit"
    REVEAL = "reveal"
    AGGREGATE = "aggregate"
    CHECK = "check"


@dataclass(frozen=True)
class RoundState:
    """The open round. ``commits``: ``(worker, receipt id, expected opt_before or b"")`` in commit order;
    ``tried``: aggregators drawn before (each timed out or was found wrong)."""

    round: int
    attempt: int
    opened: int
    beacon: bytes
    phase: Phase
    phase_height: int
    participants: tuple[bytes, ...]
    commits: tuple[tuple[bytes, bytes, bytes], ...] = ()
    reveals: tuple[bytes, ...] = ()
    aggregator: bytes = b""
    tried: tuple[bytes, ...] = ()
    aggregate: bytes = b""
    ready_height: int = 0

    def receipt_of(self, worker: bytes) -> bytes | None:
        """The id of ``worker``'s round receipt in this attempt, or None."""
        return next((rid for w, rid, _ in self.commits if w == worker), None)

    def to_dict(self) -> dict[Any, Any]:
        return {"round": self.round, "attempt": self.attempt, "opened": self.opened, "beacon": self.beacon,
                "phase": self.phase.value, "phase_height": self.phase_height,
                "participants": list(self.participants),
                "commits": [{"worker": w, "receipt": r, "opt_expected": o} for w, r, o in self.commits],
                "reveals": list(self.reveals), "aggregator": self.aggregator, "tried": list(self.tried),
                "aggregate": self.aggregate}


@dataclass(frozen=True)
class RoundSummary:
    """A finished round: θ before and after, who was accepted, who was excluded and why, the accepted workers'
    mean loss (millionths of a nat per token; -1 none), Δ bytes uploaded by the accepted workers."""

    round: int
    attempt: int
    params_before: bytes
    params_next: bytes
    momentum_next: bytes
    aggregator: bytes
    aggregate: bytes
    commits: tuple[tuple[bytes, bytes, bytes], ...]
    accepted: tuple[bytes, ...]
    excluded: tuple[tuple[bytes, str], ...]
    loss_ppm: int
    delta_bytes: int
    height: int

    def to_dict(self) -> dict[Any, Any]:
        return {"round": self.round, "attempt": self.attempt, "params_before": self.params_before,
                "params_next": self.params_next, "momentum_next": self.momentum_next,
                "aggregator": self.aggregator, "aggregate": self.aggregate,
                "commits": [{"worker": w, "receipt": r} for w, r, _ in self.commits],
                "accepted": list(self.accepted), "excluded": [list(e) for e in self.excluded],
                "loss_ppm": self.loss_ppm, "delta_bytes": self.delta_bytes, "height": self.height}


@dataclass(frozen=True)
class Run:
    """Ledger state of one run. ``params``/``momentum``: ids of θ_r and the outer momentum (``NO_MOMENTUM``
    before the first outer step); ``round``: rounds completed; ``workers``: joined, in join order; ``held``:
    ``(receipt id, worker, base units)`` final and waiting for the round's decision; ``decided``: ``(receipt id,
    pay)`` decided and waiting for the receipt to be final; ``receipts``: every round receipt and aggregate of
    the run; ``failed``: ``(round, attempt, reason)`` of attempts re-opened for lack of workers; ``attempts``:
    ``(round, attempt, beacon, participants)`` of every round attempt opened (what a replay draws batches from)."""

    post: RunPost
    height: int
    status: RunStatus = RunStatus.WAITING
    params: bytes = b""
    momentum: bytes = NO_MOMENTUM
    round: int = 0
    workers: tuple[bytes, ...] = ()
    escrow_left: int = 0
    cur: RoundState | None = None
    history: tuple[RoundSummary, ...] = ()
    held: tuple[tuple[bytes, bytes, int], ...] = ()
    decided: tuple[tuple[bytes, bool], ...] = ()
    receipts: tuple[bytes, ...] = ()
    last_opt: tuple[tuple[bytes, bytes], ...] = ()
    failed: tuple[tuple[int, int, str], ...] = ()
    attempts: tuple[tuple[int, int, bytes, tuple[bytes, ...]], ...] = ()
    paid_workers: int = 0
    paid_aggregators: int = 0
    refunded: int = 0
    final_height: int = 0

    def to_dict(self) -> dict[Any, Any]:
        p = self.post
        return {"run_id": p.run_id, "post": p.to_wire(), "height": self.height, "status": self.status.value,
                "params": self.params, "momentum": self.momentum, "round": self.round, "rounds": p.rounds,
                "workers": list(self.workers), "escrow_left": self.escrow_left, "budget": p.budget,
                "current": self.cur.to_dict() if self.cur else None,
                "history": [h.to_dict() for h in self.history], "receipts": list(self.receipts),
                "failed": [list(f) for f in self.failed], "paid_workers": self.paid_workers,
                "attempts": [{"round": a[0], "attempt": a[1], "beacon": a[2], "participants": list(a[3])}
                             for a in self.attempts],
                "paid_aggregators": self.paid_aggregators, "refunded": self.refunded,
                "final_height": self.final_height}


# ------------------------------------------------------------------ helpers

def attempt_of(run: Run, round_: int, attempt: int) -> tuple[bytes, tuple[bytes, ...]] | None:
    """``(beacon, participants)`` of a round attempt of ``run``, or None if it never opened."""
    return next(((b, p) for r, a, b, p in run.attempts if (r, a) == (round_, attempt)), None)


def runs_of(s: StateView) -> Table[bytes, Run]:
    """The ``runs`` table of state ``s``: run id (16 bytes) -> :class:`Run`."""
    return s.tables["runs"]


def open_runs(s: StateView) -> OrderedSet[bytes]:
    """The ids of the runs of ``s`` not yet terminal, in the order they were opened (the ``open_runs`` set)."""
    return s.ordered("open_runs")
