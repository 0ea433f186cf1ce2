"""Committee checks of training-run receipts (DESIGN.md "Collaborative training runs", Checks).

* A sampled :class:`~node.ledger.core.runtx.RoundReceipt` is replayed: the member fetches θ_r, the committed inner
  states, θ_worker and Δ from the worker (served only once the commit phase closed), rebuilds the worker's
  assigned batches from the dataset and the attempt's beacon, and runs
  :func:`node.training.rounds.replay_round`. A worker that never revealed in a reveal phase that ended broke
  its commitment: INVALID (the ledger shows it; it cannot stall a round by withholding). Anything this member
  cannot fetch in time is ABSTAIN, which never penalises the worker.
* A :class:`~node.ledger.core.runtx.RoundAggregate` is re-computed bit for bit from θ_r, the momentum and the
  accepted workers' Δs (:func:`node.training.rounds.recompute_outer`); any difference in either id is INVALID,
  and so is a held-out loss it claims for θ_{r+1} further than :data:`node.training.heldout.HELDOUT_TOL_PPM` from
  the member's own measurement on the same windows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from ..blobs import BlobUnavailable, fetch_blob
from ..compute.model import tokenizer_trusted
from ..duty.seams import Member
from ..duty.verdict import CheckResult
from ..encoding import commitments_root
from ..ledger.core.runs import Phase, attempt_of
from ..ledger.core.runstate import Run, runs_of
from ..ledger.core.runtx import RoundAggregate, RoundReceipt
from ..ledger.core.tx import ABSTAIN, INVALID, VALID, Verdict
from .worker import FETCH_TIMEOUT, RunCache, load_run, recompute_aggregate, theta_holders

log = logging.getLogger("tally.verify")

REVEAL_WAIT_S = 60.0  # how long a member waits for a worker's blobs before it abstains


class RunChecks:
    """The committee checks of a training run's receipts (:meth:`round_receipt`, :meth:`aggregate`) for one
    member, with the :class:`~node.training.worker.RunCache` they share: one run's trainer and windows in memory
    at a time (the member's executor runs one task at a time). Registered with the member by :meth:`checkers`."""

    def __init__(self) -> None:
        self.cache = RunCache()

    def checkers(self) -> dict[type, Callable[[Member, Any], Awaitable[CheckResult]]]:
        """Receipt type -> check, for :class:`node.verify.member.CommitteeMember`'s ``checkers``."""
        return {RoundReceipt: self.round_receipt, RoundAggregate: self.aggregate}

    async def round_receipt(self, member: Member, r: RoundReceipt) -> CheckResult:
        """:func:`check_round_receipt` with this object's cache."""
        return await check_round_receipt(member, r, self.cache)

    async def aggregate(self, member: Member, a: RoundAggregate) -> CheckResult:
        """:func:`check_aggregate` with this object's cache."""
        return await check_aggregate(member, a, self.cache)


def _reveal_missed(run: Run, r: RoundReceipt) -> bool:
    """True when the ledger shows that ``r``'s worker let its attempt's reveal phase end without revealing."""
    cur = run.cur
    if cur is not None and (cur.round, cur.attempt) == (r.round, r.attempt):
        return cur.phase in (Phase.AGGREGATE, Phase.CHECK) and r.worker not in cur.reveals
    for h in run.history:  # the round finished: was the worker among those that revealed?
        if (h.round, h.attempt) == (r.round, r.attempt):
            return any(w == r.worker and why == "not revealed" for w, why in h.excluded)
    return False


async def check_round_receipt(member: Member, r: RoundReceipt, cache: RunCache) -> CheckResult:
    """A committee member's verdict and distance (:func:`node.training.rounds.replay_round`'s) on a sampled round
    receipt; ``cache`` holds the run's trainer
    and windows between checks."""
    # local: both import torch (~2 s); only a member drawn for a round receipt replays one
    from . import rounds as rd
    from .assign import batch_tensors

    state = member.ledger.state
    run = runs_of(state).get(r.run_id)
    if run is None:
        return CheckResult(ABSTAIN)
    model_dir = await member.model_dir_for(run.post.model_id, [r.worker, run.post.sender])
    if model_dir is None:
        return CheckResult(ABSTAIN)
    holders = [r.worker]
    got = None
    with trio.move_on_after(REVEAL_WAIT_S):
        while got is None:
            run = runs_of(member.ledger.state)[r.run_id]
            if _reveal_missed(run, r):
                log.info("round receipt %s: never revealed: invalid", r.id.hex()[:16])
                return CheckResult(INVALID)
            try:
                got = [await fetch_blob(member.host, member.blobs, root, holders, timeout=FETCH_TIMEOUT, keep=False)
                       for root in (r.opt_before, r.params_after, r.opt_after, r.delta_root)]
            except BlobUnavailable:
                await member.ledger.new_block.wait()  # not revealed yet: the commit phase may still be open
    if got is None:
        return CheckResult(ABSTAIN)
    opt_before, params_after, opt_after, payload = got
    try:
        loaded = await load_run(cache, member.executor, member.host, member.blobs, model_dir, run)
        theta = await fetch_blob(member.host, member.blobs, r.params_before, theta_holders(state, run) + [r.worker],
                                 timeout=FETCH_TIMEOUT)
        commit = next((c for c in _all_commits(run) if c[1] == r.id), None)
        prev_id = commit[2] if commit else b""
        prev = (await fetch_blob(member.host, member.blobs, prev_id, [r.worker], timeout=FETCH_TIMEOUT)
                if prev_id else None)
    except (BlobUnavailable, ValueError) as e:
        log.info("abstain on round receipt %s: %s", r.id.hex()[:16], e)
        return CheckResult(ABSTAIN)
    opened = attempt_of(run, r.round, r.attempt)
    if opened is None:  # the ledger took the receipt in an attempt that opened: not reached
        return CheckResult(ABSTAIN)
    beacon, parts = opened
    try:
        a = rd.assignment(run.post, beacon, r.round, parts, loaded.windows.shape[0], r.worker)
    except ValueError:
        return CheckResult(INVALID)
    batches = batch_tensors(loaded.windows, a)
    if not tokenizer_trusted(model_dir) and commitments_root(batches) != r.batches_root:
        # our batches come from a tokenizer a peer sent (another model's dir): they, not the worker, may be wrong
        log.info("abstain on round receipt %s: batches differ under a fetched tokenizer", r.id.hex()[:16])
        return CheckResult(ABSTAIN)

    def replay() -> tuple[int, float, str]:
        expected = rd.expected_opt_before(loaded.trainer, run.post, prev)
        return rd.replay_round(loaded.trainer, run.post, theta, opt_before, expected, batches, r.batches_root,
                               params_after, opt_after, payload, r.delta_bytes)

    try:
        verdict, d, why = await member.executor.run(replay)
    except (RuntimeError, MemoryError) as e:
        log.warning("abstain on round receipt %s: %s", r.id.hex()[:16], e)
        return CheckResult(ABSTAIN)
    log.info("round receipt %s of run %s round %d: %s (%s, distance %.3g)", r.id.hex()[:16], r.run_id.hex()[:12],
             r.round, Verdict(verdict).label, why, d)
    return CheckResult(Verdict(verdict), d)


def _all_commits(run: Run) -> Iterator[tuple[bytes, bytes, bytes]]:
    if run.cur is not None:
        yield from run.cur.commits
    for h in run.history:
        yield from h.commits


async def check_aggregate(member: Member, a: RoundAggregate, cache: RunCache) -> CheckResult:
    """A committee member's verdict and distance on an aggregate: 0 and VALID iff both ids re-compute;
    ``cache`` as in :func:`check_round_receipt`."""
    state = member.ledger.state
    run = runs_of(state).get(a.run_id)
    if run is None or run.cur is None:
        return CheckResult(ABSTAIN)
    model_dir = await member.model_dir_for(run.post.model_id, [a.aggregator, run.post.sender])
    if model_dir is None:
        return CheckResult(ABSTAIN)
    holders = [a.aggregator] + theta_holders(state, run)
    try:
        loaded = await load_run(cache, member.executor, member.host, member.blobs, model_dir, run)
        res, params_id, mom_id = await recompute_aggregate(
            loaded, member.executor, member.host, member.blobs, state, run.post, run.cur.commits, a.accepted,
            a.aggregator, a.params_before, a.momentum_before, holders)
    except (BlobUnavailable, ValueError) as e:
        log.info("abstain on aggregate %s: %s", a.id.hex()[:16], e)
        return CheckResult(ABSTAIN)
    ok = params_id == a.params_next and mom_id == a.momentum_next and tuple(sorted(res.accepted)) == tuple(a.accepted)
    if ok and a.heldout_ppm:
        from .heldout import heldout_agrees, heldout_loss_ppm  # local: it imports torch, loaded by load_run already

        measured = await member.executor.run(heldout_loss_ppm, loaded.trainer, res.params, loaded.held)
        ok = heldout_agrees(a.heldout_ppm, measured)
        if not ok:
            log.info("aggregate %s claims held-out loss %.6f, measured %.6f", a.id.hex()[:16], a.heldout_ppm / 1e6,
                     measured / 1e6)
    if ok:
        member.blobs.put(res.params)  # a verified θ_{r+1}: serve it to the next round's workers
        if res.momentum is not None:
            member.blobs.put(res.momentum)
    # a mismatch on a fetched tokenizer (another model's dir) may be the screen's windows, not the aggregator
    verdict = VALID if ok else INVALID if tokenizer_trusted(model_dir) else ABSTAIN
    log.info("aggregate %s of run %s round %d: %s", a.id.hex()[:16], a.run_id.hex()[:12], a.round,
             Verdict(verdict).label + (" (fetched tokenizer)" if verdict == ABSTAIN else ""))
    return CheckResult(verdict, 0.0 if ok else math.inf)
