"""Training runs' receipts (:mod:`.runs` holds the design): a round receipt's and an aggregate's rules against
their run and their recording (:func:`check_round_receipt`, :func:`record_round_receipt`, :func:`check_aggregate`,
:func:`record_aggregate`), what their final verdicts do to the run (:func:`on_final`: the held pay, the outer step
taken, another aggregator drawn), and their :class:`~node.ledger.core.module.ReceiptKind` for the receipts module.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .module import Payouts, PlainReceipt
from .rows import ReceiptRecord
from .runrounds import _resolve, _set, _sponsor_pays
from .runstate import TERMINAL, Phase, RoundSummary, Run, RunStatus, runs_of
from .runtx import RoundAggregate, RoundReceipt
from .sampling import PPM
from .status import INVALID_S, PENDING, SAMPLED, SETTLED, VALID_S, ReceiptStatus
from .txbase import InvalidTx, Verdict, _check
from .view import StateView


def check_round_receipt(s: StateView, r: RoundReceipt) -> Run:
    """Rules of a round receipt against its run (raises :class:`InvalidTx`; changes nothing). Returns the run."""
    run: Run = runs_of(s).get(r.run_id)
    _check(run is not None, "round receipt for an unknown run")
    cur = run.cur
    if not (run.status == RunStatus.TRAINING and cur is not None and cur.phase == Phase.COMMIT):
        raise InvalidTx("the run has no round in its commit phase")
    _check((r.round, r.attempt) == (cur.round, cur.attempt),
           f"receipt for round {r.round} attempt {r.attempt}; the open one is {cur.round} attempt {cur.attempt}")
    _check(r.worker in cur.participants, "worker is not a participant of this round")
    _check(cur.receipt_of(r.worker) is None, "this worker already committed in this round")
    _check(all(s.receipts[rid].receipt.delta_root != r.delta_root for _, rid, _ in cur.commits),
           "another worker already committed this delta_root in this round attempt (a Δ belongs to the worker "
           "that computed it)")
    _check(r.sponsor == run.post.sender, "sponsor does not match the run")
    _check(r.params_before == run.params, "params_before is not the run's current parameters θ_r")
    _check(r.steps == run.post.inner_steps, f"steps must be the run's inner_steps = {run.post.inner_steps}")
    _check(r.price == run.post.receipt_price, f"price must be inner_steps × price_per_step = {run.post.receipt_price}")
    _check(r.price <= run.escrow_left, "the run's escrow cannot pay this receipt")
    prev = dict(run.last_opt).get(r.worker, b"")
    _check(run.post.inner_state != "keep" or not prev or r.opt_before == prev,
           "inner_state is keep: opt_before must be this worker's previous opt_after")
    return run


def record_round_receipt(s: StateView, r: RoundReceipt, run: Run) -> None:
    """Reserve the receipt's price and record the commitment (after :func:`check_round_receipt`)."""
    cur = run.cur
    assert cur is not None
    prev = dict(run.last_opt).get(r.worker, b"")
    last = tuple((w, o) for w, o in run.last_opt if w != r.worker) + ((r.worker, r.opt_after),)
    cur = replace(cur, commits=cur.commits + ((r.worker, r.id, prev),))
    _set(s, replace(run, escrow_left=run.escrow_left - r.price, cur=cur, last_opt=last,
                    receipts=run.receipts + (r.id,)))


def check_aggregate(s: StateView, a: RoundAggregate) -> Run:
    """Rules of an aggregate (raises :class:`InvalidTx`; changes nothing). Returns the run."""
    run: Run = runs_of(s).get(a.run_id)
    _check(run is not None, "aggregate for an unknown run")
    cur = run.cur
    if cur is None or cur.phase != Phase.AGGREGATE:
        raise InvalidTx("the run has no round waiting for its aggregate")
    _check((a.round, a.attempt) == (cur.round, cur.attempt), "aggregate for another round or attempt")
    _check(a.aggregator == cur.aggregator, "not the aggregator drawn for this round")
    _check(a.sponsor == run.post.sender, "sponsor does not match the run")
    _check(a.params_before == run.params and a.momentum_before == run.momentum,
           "params_before / momentum_before are not the run's current ones")
    _check(all(s.receipts[rid].status != SAMPLED for _, rid, _ in cur.commits),
           "sampled receipts of this round still await their verdicts")
    roots = set()
    for w in a.accepted:
        _check(w in cur.reveals, "an accepted worker did not reveal its Δ")
        rec = s.receipts[cur.receipt_of(w)]
        _check(rec.status != INVALID_S, "an accepted worker's receipt is invalid")
        roots.add(rec.receipt.delta_root)
    _check(len(roots) == len(a.accepted), "an aggregate counts each worker, and each Δ, once")
    _check(a.price == run.post.aggregator_fee, f"price must be the run's aggregator_fee = {run.post.aggregator_fee}")
    _check(a.price <= run.escrow_left, "the run's escrow cannot pay the aggregator")
    _check(a.heldout_ppm < 10**9, "heldout_ppm is a loss in millionths of a nat per token, below 1e9")
    return run


def record_aggregate(s: StateView, a: RoundAggregate, run: Run) -> None:
    cur = run.cur
    assert cur is not None
    _set(s, replace(run, escrow_left=run.escrow_left - a.price, receipts=run.receipts + (a.id,),
                    cur=replace(cur, phase=Phase.CHECK, phase_height=s.height + 1, aggregate=a.id)))


def on_final(s: StateView, r: RoundReceipt | RoundAggregate, status: ReceiptStatus, amount: int, height: int
             ) -> None:
    """A round receipt or aggregate became final with ``status`` (``valid`` or ``invalid``: a committee's verdict;
    ``settled``: not sampled, or no committee could be drawn; ``unverified``: no quorum after every escalation).
    ``amount``: what is owed to its worker (the price less the
    committee's fee; 0 when invalid), still in the sponsor's escrow. The caller paid the committee / slashed."""
    run = runs_of(s)[r.run_id]
    if isinstance(r, RoundReceipt):
        if status == INVALID_S:
            run = replace(run, escrow_left=run.escrow_left + r.price,
                          decided=tuple(d for d in run.decided if d[0] != r.id))
        else:
            pay = dict(run.decided).get(r.id)
            run = replace(run, held=run.held + ((r.id, r.worker, amount),),
                          decided=tuple(d for d in run.decided if d[0] != r.id))
            if pay is not None:  # the round already decided: pay or refund now
                run = _resolve(s, run, r.id, pay)
        _set(s, run)
        return
    cur = run.cur
    applies = status in (VALID_S, SETTLED)
    if not applies:
        run = replace(run, escrow_left=run.escrow_left + r.price)
    if cur is None or cur.aggregate != r.id or run.status in TERMINAL:
        if applies:  # an aggregate of a run that meanwhile expired: the work was done, pay it
            _sponsor_pays(s, run, r.aggregator, amount)
            run = replace(run, paid_aggregators=run.paid_aggregators + amount)
        _set(s, run)
        return
    if not applies:  # wrong (or unverifiable): draw another aggregator in end_block
        _set(s, replace(run, cur=replace(cur, phase=Phase.AGGREGATE, phase_height=height, aggregator=b"",
                                         tried=cur.tried + (r.aggregator,), aggregate=b"", ready_height=0)))
        return
    _sponsor_pays(s, run, r.aggregator, amount)
    run = replace(run, paid_aggregators=run.paid_aggregators + amount)
    accepted = set(r.accepted)
    excluded: list[tuple[bytes, str]] = []
    losses, nbytes = [], 0
    for w in cur.participants:
        rid = cur.receipt_of(w)
        if rid is None:
            excluded.append((w, "not committed"))
            continue
        rec = s.receipts[rid]
        if w in accepted:
            if rec.receipt.loss_ppm >= 0:
                losses.append(rec.receipt.loss_ppm)
            nbytes += rec.receipt.delta_bytes
            run = _resolve(s, run, rid, True)
        else:
            why = ("invalid" if rec.status == INVALID_S else "not revealed" if w not in cur.reveals
                   else "screened out")
            excluded.append((w, why))
            if rec.status != INVALID_S:
                run = _resolve(s, run, rid, False)
    summary = RoundSummary(round=cur.round, attempt=cur.attempt, params_before=run.params, params_next=r.params_next,
                           momentum_next=r.momentum_next, aggregator=r.aggregator, aggregate=r.id,
                           commits=cur.commits, accepted=tuple(sorted(accepted)), excluded=tuple(excluded),
                           loss_ppm=(sum(losses) // len(losses)) if losses else -1, delta_bytes=nbytes,
                           height=height)
    run = replace(run, params=r.params_next, momentum=r.momentum_next, round=run.round + 1, cur=None,
                  history=run.history + (summary,))
    if run.round >= run.post.rounds:
        run = replace(run, status=RunStatus.FINISHING)
    _set(s, run)


class _RunReceipts(PlainReceipt):
    """Round receipts and aggregates: the run, not the requester's escrow alone, pays them (:func:`on_final`).
    A round receipt is sampled when its round's commit phase closes; every aggregate is re-computed."""

    def __init__(self, aggregate: bool):
        self.aggregate = aggregate

    def sampled_later(self, rec: ReceiptRecord) -> bool:
        return not self.aggregate and rec.status == PENDING and not rec.p_ppm

    def sample_ppm(self, s: StateView, r: RoundReceipt | RoundAggregate, ppm: int) -> int:
        return PPM if self.aggregate else ppm

    def split(self, s: StateView, r: RoundReceipt | RoundAggregate, verdict: Verdict, payouts: Payouts
              ) -> tuple[Payouts, int]:
        # the run holds the worker's part (or takes back the refund) itself
        owed = dict(payouts).get(r.worker, 0) if verdict == Verdict.VALID else 0
        keep = r.worker if verdict == Verdict.VALID else r.requester
        payouts = [(a, amt) for a, amt in payouts if a != keep]
        req = s.account(r.requester)  # undo the release of escrow: what the run still owes stays in escrow
        s.accounts[r.requester] = replace(req, escrow=req.escrow + (owed if verdict == Verdict.VALID else r.price))
        return payouts, owed

    def finalized(self, s: StateView, r: RoundReceipt | RoundAggregate, verdict: Verdict, owed: int,
                  height: int) -> None:
        on_final(s, r, VALID_S if verdict == Verdict.VALID else INVALID_S, owed, height)

    def owner_final(self, s: StateView, r: RoundReceipt | RoundAggregate) -> int | None:
        run = runs_of(s).get(r.run_id)
        return int(run.final_height or 0) if run is not None else 0

    def settle_unchecked(self, s: StateView, rec: ReceiptRecord, status: str, height: int) -> bool:
        r: Any = rec.receipt  # a RoundReceipt or RoundAggregate (this kind's records only)
        s.receipts[r.id] = replace(rec, status=status, final_height=height)  # paid by the run once its round decides
        s.open_receipts.pop(r.id, None)
        on_final(s, r, ReceiptStatus(status), r.price, height)  # settled or unverified
        return True
