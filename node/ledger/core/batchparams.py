"""The genesis parameters of batch jobs checked by majority vote (:mod:`node.ledger.core.batch`,
:mod:`node.ledger.core.batchaudit`). Every one is left out of the genesis hash and document when 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .params import GenesisError, ParamPart
from .sampling import PPM


class _Needs(Protocol):
    @property
    def slash_amount(self) -> int: ...

    @property
    def batch_slash(self) -> int: ...

    @property
    def batch_absent_penalty(self) -> int: ...

    @property
    def min_replication(self) -> int: ...

    @property
    def batch_max_held(self) -> int: ...

    @property
    def batch_audit_ppm(self) -> int: ...

    @property
    def batch_min_token_price(self) -> int: ...

    @property
    def batch_max_open_items(self) -> int: ...

    @property
    def batch_audit_pay_bps(self) -> int: ...


@dataclass(frozen=True)
class BatchParams:
    """Batch jobs' slashing, replication, assignment limits, audits and prices.

    * ``batch_slash``: what a worker whose revealed result differs from the quorum's loses (at most its bond), 0
      meaning ``slash_amount``; ``batch_absent_penalty``: what one that never committed or never revealed loses, 0
      meaning ``job_start_penalty`` (less than the slash);
    * ``min_replication`` > 0: workers with a run of ``adapt_step`` quorum agreements lower an item's replication
      toward it (BOINC adaptive replication), 0 meaning never;
    * ``batch_max_held``: a worker holding this many undecided assignments is not drawn for more (BOINC's
      ``max_wus_in_progress``; each consecutive absence halves it, to 1), 0: no limit;
    * ``batch_audit_ppm``: the probability that an accepted item is re-run by a committee, 0: never;
    * ``batch_min_token_price``: a post pays at least this many base units per token per replica (0 means 1);
      ``batch_max_open_items``: one requester's unsettled batches hold at most this many items (0: one full batch);
    * ``batch_audit_pay_bps``: each audit committee member that voted the outcome is paid ``price ×
      batch_audit_pay_bps / 10^4`` per item (escrowed by the post), 0: members are unpaid.
    """

    batch_slash: int = 0
    batch_absent_penalty: int = 0
    min_replication: int = 0
    batch_max_held: int = 0
    batch_audit_ppm: int = 0
    batch_min_token_price: int = 0
    batch_max_open_items: int = 0
    batch_audit_pay_bps: int = 0

    def batch_token_floor(self) -> int:
        """Base units per token of work a batch must pay at least: ``batch_min_token_price``, 0 meaning 1."""
        return self.batch_min_token_price or 1


def check_batch_params(p: _Needs) -> None:
    """Raises :class:`GenesisError` for a bound out of its range (each message names it)."""
    if p.batch_absent_penalty and not p.batch_absent_penalty < (p.batch_slash or p.slash_amount):
        raise GenesisError("need batch_absent_penalty < batch_slash (0 meaning slash_amount): an absent "
                           "batch worker must lose less than an out-voted one")
    if p.min_replication > 16:
        raise GenesisError("min_replication must be 0 (no adaptive replication) or in 1..16")
    if p.batch_audit_ppm > PPM:
        raise GenesisError("batch_audit_ppm must be in 0..1000000 (a probability in parts per million)")
    if p.batch_min_token_price > 10**15:
        raise GenesisError("batch_min_token_price must be 0 (meaning 1) or at most 10^15 base units per token")
    if p.batch_max_open_items > 10**9:
        raise GenesisError("batch_max_open_items must be 0 (one full batch) or at most 10^9 items")
    if p.batch_audit_pay_bps > 100_000:
        raise GenesisError("batch_audit_pay_bps must be in 0..100000 (at most 10 times an item's price per "
                           "member)")
    if p.batch_max_held > 1_000_000:
        raise GenesisError("batch_max_held must be 0 (no limit) or in 1..1000000 undecided assignments")


BATCH_PART = ParamPart(BatchParams, frozenset({
        "batch_slash", "batch_absent_penalty", "min_replication", "batch_max_held", "batch_audit_ppm",
        "batch_min_token_price", "batch_max_open_items", "batch_audit_pay_bps"}), check_batch_params)

__all__ = ["BATCH_PART", "BatchParams", "check_batch_params"]
