"""The genesis parameters of the job marketplace (:mod:`node.ledger.core.jobs`): its liveness and deadlines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .params import GenesisError, ParamPart


class _Needs(Protocol):
    @property
    def min_bond(self) -> int: ...

    @property
    def job_start_window(self) -> int: ...

    @property
    def job_start_penalty(self) -> int: ...

    @property
    def job_release_penalty(self) -> int: ...

    @property
    def max_job_deadline(self) -> int: ...


@dataclass(frozen=True)
class JobParams:
    """An accepted job shows its first segment within ``job_start_window`` blocks or returns to open, the worker's
    bond paying ``job_start_penalty`` (base units); a worker that gives a job back before its first segment pays
    ``job_release_penalty``; a post's deadline is at most ``max_job_deadline`` blocks after its inclusion."""

    job_start_window: int = 600
    job_start_penalty: int = 2_000_000_000
    job_release_penalty: int = 500_000_000
    max_job_deadline: int = 100_000


def check_job_params(p: _Needs) -> None:
    """Raises :class:`GenesisError` unless a bonded worker can always pay one job's start penalty, releasing
    costs less than holding, and a job can start before its deadline."""
    if not 0 <= p.job_release_penalty < p.job_start_penalty <= p.min_bond:
        raise GenesisError("need 0 <= job_release_penalty < job_start_penalty <= min_bond (a bonded worker can "
                           "always pay the start penalty of one job, and releasing costs less than holding)")
    if not 1 <= p.job_start_window <= p.max_job_deadline:
        raise GenesisError("need 1 <= job_start_window <= max_job_deadline (a job can start before its deadline)")


JOB_PART = ParamPart(JobParams, frozenset(), check_job_params)

__all__ = ["JOB_PART", "JobParams", "check_job_params"]
