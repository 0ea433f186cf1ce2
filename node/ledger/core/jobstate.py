"""The ledger records of fine-tune jobs (values only; the state machine is :mod:`node.ledger.core.jobs`).

Tables (:mod:`node.ledger.core.records`): ``jobs`` (job id -> :class:`Job`) and the insertion-ordered set
``open_jobs`` (ids of the jobs not yet terminal), both owned by the jobs module; :func:`jobs_of` and
:func:`open_jobs` reach them from any state (:class:`node.ledger.core.view.StateView`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .jobtx import JobPost
from .kv import OrderedSet, Table
from .view import StateView


class JobStatus(enum.StrEnum):
    """A fine-tune job's status on the ledger (stored and served as its value, equal to that string)."""

    OPEN = "open"
    ACCEPTED = "accepted"
    DELIVERED = "delivered"
    SETTLED = "settled"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    FAILED = "failed"
    DIVERGED = "diverged"


OPEN, ACCEPTED, DELIVERED, SETTLED = JobStatus.OPEN, JobStatus.ACCEPTED, JobStatus.DELIVERED, JobStatus.SETTLED
CANCELLED, EXPIRED, FAILED, DIVERGED = JobStatus.CANCELLED, JobStatus.EXPIRED, JobStatus.FAILED, JobStatus.DIVERGED
TERMINAL: frozenset[str] = frozenset({SETTLED, CANCELLED, EXPIRED, FAILED, DIVERGED})
# why a worker lost a job it had accepted (``Job.dropped``)
START_TIMEOUT, RELEASED = "start_timeout", "released"
STATUS_TEXT = {
    OPEN: "waiting for a bonded worker to accept", ACCEPTED: "training", DELIVERED: "adapter delivered; "
    "waiting for the last segments' verdicts", SETTLED: "settled", CANCELLED: "cancelled before acceptance; "
    "escrow refunded", EXPIRED: "deadline passed without delivery; unspent escrow refunded",
    FAILED: "a training segment was voted invalid; the worker was slashed and unspent escrow refunded",
    DIVERGED: "training diverged (the loss became NaN or infinite); unspent escrow refunded",
}


@dataclass(frozen=True)
class Job:
    """Ledger state of one job. ``losses``: per segment, mean loss in millionths of a nat per token (-1: NaN).
    ``dropped``: ``(worker, START_TIMEOUT | RELEASED, height, penalty in base units)`` for each worker that held
    the job and lost it before its first segment (those workers cannot accept it again)."""

    post: JobPost
    height: int
    status: str = OPEN
    worker: bytes = b""
    accepted_height: int = 0
    segments: tuple[bytes, ...] = ()
    next_step: int = 0
    last_state: bytes = b""
    adapter: bytes = b""
    escrow_left: int = 0
    refunded: int = 0
    losses: tuple[int, ...] = ()
    final_height: int = 0
    dropped: tuple[tuple[bytes, str, int, int], ...] = ()

    def to_dict(self) -> dict[Any, Any]:
        p = self.post
        return {"job_id": p.job_id, "post": p.to_wire(), "height": self.height, "status": self.status,
                "worker": self.worker, "accepted_height": self.accepted_height, "segments": list(self.segments),
                "next_step": self.next_step, "last_state": self.last_state, "adapter": self.adapter,
                "escrow_left": self.escrow_left, "refunded": self.refunded, "losses": list(self.losses),
                "final_height": self.final_height, "dropped": [list(d) for d in self.dropped]}


def jobs_of(s: StateView) -> Table[bytes, Job]:
    """The ``jobs`` table of state ``s``: job id (16 bytes) -> :class:`Job`."""
    return s.tables["jobs"]


def open_jobs(s: StateView) -> OrderedSet[bytes]:
    """The ids of the jobs of ``s`` not yet terminal, in the order they were opened (the ``open_jobs`` set)."""
    return s.ordered("open_jobs")
