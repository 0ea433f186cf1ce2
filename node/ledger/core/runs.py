"""Collaborative training runs on the ledger: a pure state machine (called from :mod:`node.ledger.core.state`).

A run (:class:`~node.ledger.core.runtx.RunPost`) goes through rounds; each round through phases (:class:`Phase`):

1. **COMMIT** — opened in ``end_block`` of height h when at least ``min_workers`` have joined: the round's
   participants (the first ``max_workers`` joined workers, in join order, then sorted) and its beacon (the hash
   of block h, which nobody knew when they joined) are fixed; the beacon draws each participant's batches
   (:func:`node.training.assign.assign_round`). Participants submit one :class:`RoundReceipt` each. The phase
   closes when all committed or ``round_timeout`` blocks passed.
2. **REVEAL** — at the close, every commitment is sampled (probability ``max(p(worker), sample_ppm,
   floor)``, :func:`run_floor_ppm`; beacon: the closing block's hash) and sampled ones get a committee, exactly
   like other receipts. Only now do workers
   serve their Δ (and the committed states): :class:`RoundReveal`. Closes when all committed workers revealed
   or after ``round_timeout`` blocks.
3. **AGGREGATE** — an aggregator is drawn by the beacon among the workers that revealed. The ledger refuses its
   :class:`RoundAggregate` until every sampled receipt of the round is final (**the outer step waits for the
   verdicts**, so an invalid Δ never enters θ and no momentum ever absorbs it; the alternative, subtracting it
   at the next outer step, cannot undo what Nesterov momentum carried forward — see the session notes for the
   measured cost). An aggregate may accept only revealed workers whose receipts are not invalid; the aggregator
   drops more by the loss screen and non-finite checks. If none arrives within ``round_timeout`` blocks another
   aggregator is drawn; so is one at once if the verdicts slashed the drawn one below ``min_bond`` (it could not
   post).
4. **CHECK** — the aggregate is a receipt sampled with probability 1: a committee re-computes the outer step
   bit for bit. Valid: θ_{r+1} and the momentum are the run's, the aggregator is paid ``aggregator_fee`` (less
   the committee's fee), and round r+1 opens in the next ``end_block``. Invalid: the aggregator is slashed like
   any worker, the fee returns to the escrow, another aggregator is drawn. A round whose commit or reveal phase
   ends with fewer than ``min_workers`` is re-opened (``attempt`` + 1) with a fresh beacon, and its commit and
   reveal phases then wait longer: ``round_timeout × min(attempt + 1, MAX_TIMEOUT_STEPS)`` blocks
   (:func:`phase_timeout`; Tendermint likewise lengthens its timeouts with every round of a height). Without it, a
   network whose workers need a little more than ``round_timeout`` to train H steps fails every attempt
   forever (seen: 39 attempts of round 0 at load 14 on two cores, each missing the window by seconds).

Money (base units; the whole budget sits in the sponsor's ``escrow`` from the post): a round receipt reserves
``H × price_per_step`` from ``Run.escrow_left``; when final, the committee's fee (valid) or the worker's slash
(invalid) move as for every receipt; the worker's part is **held** until the round decides whether its Δ was
accepted: accepted → paid to the worker, excluded (not revealed, screened out, non-finite) → back to
``escrow_left``; an invalid receipt's price goes back to ``escrow_left`` at once. A receipt of an attempt that
failed for lack of workers is paid on a valid verdict (the work was done as asked). At the end (all rounds, the
deadline, or a cancel) and once every receipt of the run is final, ``escrow_left`` returns to the sponsor. So
every contribution is paid at most once and the run never pays more than its budget; the supply is unchanged.

**A Δ belongs to the worker that committed it first** (issue 24 finding 3). A receipt's ``delta_root`` is public
once it is on the ledger, and the Δ bytes once the commit phase closes, so a participant could commit another's
root, fetch the bytes after the close, reveal and be paid ``H × price`` for no work, and the aggregate would count
that Δ twice. The ledger therefore refuses a round receipt whose ``delta_root`` another worker already committed
in the same round attempt, and an aggregate that accepts one root (or one worker) twice. Of the issue's two
options this one was chosen over committing ``H(worker ‖ Δ root)`` because it needs no change of the receipt, the
reveal, the committee's replay or the aggregator (every one of them addresses the Δ blob by its root), and it
closes the copy outright rather than making it worthless. What it leaves: a copier that sees a receipt in gossip
before its block could race it into the block first (the mempool is first come, first served, and the honest
receipt usually reaches the proposer before the copy made from it); the honest worker's receipt is then refused,
and its node keeps its Δ unserved (:class:`node.training.worker.RunWorker` serves only what landed), so the copier
can never reveal bytes for the root it took: it is not paid, and if sampled it is slashed for the missing reveal.
A Δ revealed in an *earlier* attempt or round is a stale Δ, caught only by sampling, which has a floor per run
(:func:`run_floor_ppm`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any

from ...encoding import H
from . import committee as cm, history
from .jobtx import parse_targets
from .module import Module, Payouts, PlainReceipt, admit_receipt
from .rows import ReceiptRecord
from .runstate import MAX_JOINED, TERMINAL, Phase, RoundState, RoundSummary, Run, RunStatus, attempt_of
from .runtx import (
    CODECS,
    INNER_STATE,
    RUN_TXS,
    TRAINABLE,
    RoundAggregate,
    RoundReceipt,
    RoundReveal,
    RunCancel,
    RunJoin,
    RunLeave,
    RunPost,
)
from .sampling import PPM, is_sampled, sampling_ppm
from .status import FINAL, INVALID_S, PENDING, SAMPLED, SETTLED, VALID_S, ReceiptStatus
from .txbase import InvalidTx, Tx, Verdict, _check
from .view import StateView


def _set(s: StateView, run: Run) -> None:
    rid = run.post.run_id
    s.runs[rid] = run
    if run.status in TERMINAL and run.final_height:  # an expired run stays open until its escrow is returned
        s.open_runs.pop(rid, None)
    else:
        s.open_runs[rid] = None


def _sponsor_pays(s: StateView, run: Run, to: bytes, amount: int) -> None:
    """``amount`` leaves the sponsor's escrow for ``to``'s balance."""
    if amount:
        sp = s.account(run.post.sender)
        s.accounts[run.post.sender] = replace(sp, escrow=sp.escrow - amount)
        acc = s.account(to)
        s.accounts[to] = replace(acc, balance=acc.balance + amount)


def _round_key(run_id: bytes, round_: int, attempt: int) -> bytes:
    return H(b"tally/run-round/v1", run_id, round_.to_bytes(4, "big"), attempt.to_bytes(4, "big"))


def _active(s: StateView, run: Run) -> tuple[bytes, ...]:
    """The next round's participants: joined workers still bonded, the first ``max_workers`` by join order,
    sorted by account (the canonical order of assignments and of the outer step)."""
    ok = [w for w in run.workers if s.account(w).bond >= s.params.min_bond][: run.post.max_workers]
    return tuple(sorted(ok))


def _open_round(s: StateView, run: Run, height: int, beacon: bytes, attempt: int) -> Run:
    parts = _active(s, run)
    if len(parts) < run.post.min_workers:
        return replace(run, status=RunStatus.WAITING, cur=None)
    cur = RoundState(round=run.round, attempt=attempt, opened=height, beacon=beacon, phase=Phase.COMMIT,
                     phase_height=height, participants=parts)
    return replace(run, status=RunStatus.TRAINING, cur=cur,
                   attempts=run.attempts + ((run.round, attempt, beacon, parts),))


def _resolve(s: StateView, run: Run, rid: bytes, pay: bool) -> Run:
    """Apply the round's decision ``pay`` to receipt ``rid``: now if it is final (held), else remember it."""
    for i, (hid, worker, amount) in enumerate(run.held):
        if hid == rid:
            held = run.held[:i] + run.held[i + 1:]
            if pay:
                _sponsor_pays(s, run, worker, amount)
                return replace(run, held=held, paid_workers=run.paid_workers + amount)
            return replace(run, held=held, escrow_left=run.escrow_left + amount)
    return replace(run, decided=run.decided + ((rid, pay),))


def _fail_attempt(s: StateView, run: Run, height: int, beacon: bytes, reason: str) -> Run:
    """Too few workers committed or revealed: pay the revealed/committed work on its verdict (it was done as
    asked), refund what was withheld, and re-open the round with a fresh beacon."""
    cur = run.cur
    assert cur is not None
    for w, rid, _ in cur.commits:
        run = _resolve(s, run, rid, pay=(cur.phase == Phase.COMMIT or w in cur.reveals))
    run = replace(run, failed=run.failed + ((cur.round, cur.attempt, reason),))
    return _open_round(s, run, height, beacon, cur.attempt + 1)


def run_floor_ppm(price: int, slashable: int) -> int:
    """The least sampling rate (ppm) of a round receipt at which a worker that is paid ``price`` base units for it
    and loses ``slashable`` base units (``min(bond, slash_amount)``) when a committee finds it invalid loses in
    expectation by cheating: the smallest ``p`` with ``p·slashable > (1 − p)·price`` (1e6 when nothing can be
    slashed). The genesis floor ``sample_floor_ppm`` is checked against ``slash_amount`` and
    ``max_receipt_price``; a worker bonded with less than ``slash_amount`` risks less, and a long run of valid
    verdicts elsewhere lowers its adaptive rate to that floor, so a run's receipts never sample below this."""
    if price <= 0:
        return 0
    if slashable <= 0:
        return PPM
    return min(PPM, PPM * price // (slashable + price) + 1)


def _sample_commits(s: StateView, run: Run, height: int, beacon: bytes) -> None:
    """Draw which of the round's receipts a committee replays (beacon: the block that closed the commits)."""
    p = s.params
    assert run.cur is not None
    for w, rid, _ in run.cur.commits:
        rec = s.receipts[rid]
        worker = s.account(w)
        ppm = max(sampling_ppm(p.sample_base_ppm, p.sample_floor_ppm, worker.valid_run, p.adapt_step),
                  run.post.sample_ppm, run_floor_ppm(run.post.receipt_price, min(worker.bond, p.slash_amount)))
        if is_sampled(beacon, rid, ppm):
            com = cm.select_committee(beacon, rid, 0, s.eligible(), (w, run.post.sender), p.committee_size)
            if com:
                s.receipts[rid] = replace(rec, status=SAMPLED, p_ppm=ppm, committee=com, round_height=height)
                continue
        s.receipts[rid] = replace(rec, p_ppm=ppm)


def _draw_aggregator(s: StateView, run: Run, beacon: bytes) -> bytes:
    cur = run.cur
    assert cur is not None
    key = _round_key(run.post.run_id, cur.round, cur.attempt)
    pool = [w for w in cur.reveals if s.account(w).bond >= s.params.min_bond]
    pick = cm.select_committee(beacon, key, 0, pool, cur.tried, 1)
    if not pick:  # every revealed worker was tried: any bonded account but the sponsor
        pick = cm.select_committee(beacon, key, 0, s.eligible(), cur.tried + (run.post.sender,), 1)
    return pick[0] if pick else b""


# ------------------------------------------------------------------ transactions

def check_post(s: StateView, tx: RunPost) -> None:
    """Every rule of a run post (raises :class:`InvalidTx`; changes nothing)."""
    height = s.height + 1
    p = s.params
    _check(tx.run_id not in s.runs, "a run with this id exists")
    _check(tx.trainable in TRAINABLE, f"trainable must be one of {', '.join(TRAINABLE)}")
    if tx.trainable == "lora":
        _check(1 <= tx.rank <= 256, f"rank must be in 1..256 (got {tx.rank})")
        try:
            parse_targets(tx.targets)
        except ValueError as e:
            raise InvalidTx(str(e)) from None
    _check(tx.codec in CODECS, f"codec must be one of {', '.join(CODECS)}")
    _check(tx.codec != "topk" or 1 <= tx.topk_ppm <= PPM, "topk needs topk_ppm in 1..1e6")
    _check(tx.inner_state in INNER_STATE, f"inner_state must be one of {', '.join(INNER_STATE)}")
    _check(1 <= tx.inner_steps <= 10_000 and 1 <= tx.rounds <= 10_000, "inner_steps and rounds in 1..10000")
    _check(1 <= tx.min_workers <= tx.max_workers <= 256, "need 1 <= min_workers <= max_workers <= 256")
    _check(1 <= tx.batch_size <= 256 and 2 <= tx.seq_len <= 8192, "batch_size 1..256, seq_len 2..8192")
    _check(0 <= tx.screen_windows <= 256, "screen_windows in 0..256")
    _check(1 <= tx.lr_micro <= 10**7, "lr_micro in 1..1e7")
    _check(1 <= tx.outer_lr_ppm <= 10 * PPM and tx.outer_momentum_ppm < PPM and tx.nesterov in (0, 1),
           "outer_lr_ppm in 1..1e7, outer_momentum_ppm < 1e6, nesterov 0 or 1")
    _check(tx.clip_ppm >= PPM, "clip_ppm must be at least 1e6 (one median norm)")
    _check(0 <= tx.sample_ppm <= PPM, "sample_ppm in 0..1e6")
    _check(tx.price_per_step >= 1, "price_per_step >= 1")
    _check(tx.receipt_price <= p.max_receipt_price and tx.aggregator_fee <= p.max_receipt_price,
           "a round receipt's price (inner_steps × price_per_step) and aggregator_fee must not exceed "
           "max_receipt_price")
    _check(1 <= tx.round_timeout <= 10_000, "round_timeout in 1..10000 blocks")
    _check(tx.deadline > height, "deadline already passed")
    _check(tx.deadline - height <= p.max_job_deadline,
           f"deadline is {tx.deadline - height} blocks after the post; this chain allows at most "
           f"max_job_deadline = {p.max_job_deadline}")
    _check(s.account(tx.sender).balance >= tx.budget,
           f"balance cannot cover the run's budget of {tx.budget} base units")


def apply_run_tx(s: StateView, tx: Tx) -> None:
    """Apply a run transaction (post, join, leave, cancel, reveal) in place; checks first, so a refused one
    changes nothing. The caller checks and advances nonces.

    Raises:
        InvalidTx: as documented per kind in :mod:`node.ledger.core.runtx`.
    """
    height = s.height + 1
    if isinstance(tx, RunPost):
        check_post(s, tx)
        acc = s.account(tx.sender)
        s.accounts[tx.sender] = replace(acc, balance=acc.balance - tx.budget, escrow=acc.escrow + tx.budget)
        _set(s, Run(post=tx, height=height, params=tx.params0, escrow_left=tx.budget))
        return
    run: Run = s.runs.get(getattr(tx, "run_id", None))  # every run transaction but the post names its run
    _check(run is not None, "unknown run")
    if isinstance(tx, RunJoin):
        _check(run.status in (RunStatus.WAITING, RunStatus.TRAINING), f"run is {run.status.value}")
        _check(tx.sender != run.post.sender, "the sponsor cannot join its own run")
        _check(tx.sender not in run.workers, "already joined")
        _check(len(run.workers) < MAX_JOINED, f"a run has at most {MAX_JOINED} joined workers")
        _check(s.account(tx.sender).bond >= s.params.min_bond, "worker is not bonded")
        _set(s, replace(run, workers=run.workers + (tx.sender,)))
    elif isinstance(tx, RunLeave):
        _check(tx.sender in run.workers, "not a worker of this run")
        _set(s, replace(run, workers=tuple(w for w in run.workers if w != tx.sender)))
    elif isinstance(tx, RunCancel):
        _check(tx.sender == run.post.sender, "only the sponsor can cancel a run")
        _check(run.status == RunStatus.WAITING and not run.receipts and not run.failed,
               "only a run whose first round never opened can be cancelled")
        sp = s.account(tx.sender)
        s.accounts[tx.sender] = replace(sp, balance=sp.balance + run.escrow_left, escrow=sp.escrow - run.escrow_left)
        _set(s, replace(run, status=RunStatus.CANCELLED, refunded=run.escrow_left, escrow_left=0,
                        final_height=height))
    elif isinstance(tx, RoundReveal):
        cur = run.cur
        if cur is None or cur.phase != Phase.REVEAL:
            raise InvalidTx("the run has no round in its reveal phase")
        _check((tx.round, tx.attempt) == (cur.round, cur.attempt), "reveal for another round or attempt")
        rid = cur.receipt_of(tx.worker)
        _check(rid is not None, "no commitment of this worker in this round")
        _check(tx.worker not in cur.reveals, "already revealed")
        _check(s.receipts[rid].receipt.delta_root == tx.delta_root, "delta_root differs from the commitment")
        _set(s, replace(run, cur=replace(cur, reveals=cur.reveals + (tx.worker,))))
    else:  # pragma: no cover - state.apply_tx dispatches only the kinds above
        raise InvalidTx("unknown run transaction")


def check_round_receipt(s: StateView, r: RoundReceipt) -> Run:
    """Rules of a round receipt against its run (raises :class:`InvalidTx`; changes nothing). Returns the run."""
    run: Run = s.runs.get(r.run_id)
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
    run: Run = s.runs.get(a.run_id)
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
    return run


def record_aggregate(s: StateView, a: RoundAggregate, run: Run) -> None:
    cur = run.cur
    assert cur is not None
    _set(s, replace(run, escrow_left=run.escrow_left - a.price, receipts=run.receipts + (a.id,),
                    cur=replace(cur, phase=Phase.CHECK, phase_height=s.height + 1, aggregate=a.id)))


# ------------------------------------------------------------------ verdicts

def on_final(s: StateView, r: RoundReceipt | RoundAggregate, status: ReceiptStatus, amount: int, height: int
             ) -> None:
    """A round receipt or aggregate became final with ``status`` (``valid`` or ``invalid``: a committee's verdict;
    ``settled``: not sampled, or no committee could be drawn; ``unverified``: no quorum after every escalation).
    ``amount``: what is owed to its worker (the price less the
    committee's fee; 0 when invalid), still in the sponsor's escrow. The caller paid the committee / slashed."""
    run = s.runs[r.run_id]
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


# ------------------------------------------------------------------ per block

def end_block_runs(s: StateView, height: int, block_hash: bytes, final_status: AbstractSet[str]) -> None:
    """Open rounds, close phases at their ends or timeouts, sample closed commitments, draw aggregators, expire
    runs past their deadline, and return the unspent escrow of ended runs once all their receipts are final."""
    for rid in list(s.open_runs):
        run = s.runs[rid]
        p = run.post
        if run.status in (RunStatus.WAITING, RunStatus.TRAINING) and height > p.deadline:
            if run.cur is not None:
                if run.cur.phase == Phase.COMMIT:  # draw the samples the commit close would have drawn
                    _sample_commits(s, run, height, block_hash)
                for _, crid, _ in run.cur.commits:  # work done in the unfinished round is paid on its verdict
                    if s.receipts[crid].status not in final_status or any(h[0] == crid for h in run.held):
                        run = _resolve(s, run, crid, True)
            run = replace(run, status=RunStatus.EXPIRED, cur=None)
        if ((run.status == RunStatus.WAITING and run.round < p.rounds)
                or (run.status == RunStatus.TRAINING and run.cur is None)):
            run = _open_round(s, run, height, block_hash, 0)
        elif run.status == RunStatus.TRAINING and run.cur is not None:
            run = _advance(s, run, height, block_hash)
        if (run.status in (RunStatus.FINISHING, RunStatus.EXPIRED) and not run.final_height and not run.held
                and not run.decided and all(s.receipts[x].status in final_status for x in run.receipts)):
            left = run.escrow_left
            sp = s.account(p.sender)
            s.accounts[p.sender] = replace(sp, balance=sp.balance + left, escrow=sp.escrow - left)
            status = RunStatus.FINISHED if run.status == RunStatus.FINISHING else RunStatus.EXPIRED
            run = replace(run, status=status, escrow_left=0, refunded=run.refunded + left, final_height=height)
            history.schedule_owner_leave(s, run.receipts, height, final_status)
        _set(s, run)


MAX_TIMEOUT_STEPS = 8  # the commit and reveal phases of a re-opened round wait at most 8 × round_timeout


def phase_timeout(round_timeout: int, attempt: int) -> int:
    """Blocks the commit or reveal phase of attempt ``attempt`` (0-based) of a round stays open for at most:
    ``round_timeout × min(attempt + 1, MAX_TIMEOUT_STEPS)``."""
    return round_timeout * min(attempt + 1, MAX_TIMEOUT_STEPS)


def _advance(s: StateView, run: Run, height: int, beacon: bytes) -> Run:
    cur = run.cur
    assert cur is not None
    p = run.post
    timed_out = height >= cur.phase_height + phase_timeout(p.round_timeout, cur.attempt)
    if cur.phase == Phase.COMMIT:
        if len(cur.commits) == len(cur.participants) or timed_out:
            if len(cur.commits) < p.min_workers:
                _sample_commits(s, run, height, beacon)
                return _fail_attempt(s, run, height, beacon, f"{len(cur.commits)} committed")
            _sample_commits(s, run, height, beacon)
            return replace(run, cur=replace(cur, phase=Phase.REVEAL, phase_height=height))
    elif cur.phase == Phase.REVEAL:
        if len(cur.reveals) == len(cur.commits) or timed_out:
            if len(cur.reveals) < p.min_workers:
                return _fail_attempt(s, run, height, beacon, f"{len(cur.reveals)} revealed")
            cur = replace(cur, phase=Phase.AGGREGATE, phase_height=height)
            return replace(run, cur=replace(cur, aggregator=_draw_aggregator(s, replace(run, cur=cur), beacon)))
    elif cur.phase == Phase.AGGREGATE:
        if not cur.aggregator:
            agg = _draw_aggregator(s, run, beacon)
            return replace(run, cur=replace(cur, aggregator=agg, phase_height=height, ready_height=0))
        if all(s.receipts[x].status != SAMPLED for _, x, _ in cur.commits):
            if s.account(cur.aggregator).bond < s.params.min_bond:
                # slashed below the minimum bond since it was drawn (a cheater voted invalid): the ledger refuses
                # its aggregate ("worker is not bonded"), so draw another now instead of after round_timeout
                cur = replace(cur, tried=cur.tried + (cur.aggregator,), aggregator=b"", ready_height=0)
                return replace(run, cur=replace(cur, aggregator=_draw_aggregator(s, replace(run, cur=cur), beacon)))
            if not cur.ready_height:
                return replace(run, cur=replace(cur, ready_height=height))
            if height >= cur.ready_height + p.round_timeout:  # the aggregator did not post: draw another
                tried = cur.tried + (cur.aggregator,)
                cur = replace(cur, tried=tried, aggregator=b"", ready_height=0)
                return replace(run, cur=replace(cur, aggregator=_draw_aggregator(s, replace(run, cur=cur), beacon)))
    return run


# ------------------------------------------------------------------ the module (node.ledger.core.modules)


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

    def settle_unchecked(self, s: StateView, rec: ReceiptRecord, status: str, height: int) -> bool:
        r: Any = rec.receipt  # a RoundReceipt or RoundAggregate (this kind's records only)
        s.receipts[r.id] = replace(rec, status=status, final_height=height)  # paid by the run once its round decides
        s.open_receipts.pop(r.id, None)
        on_final(s, r, ReceiptStatus(status), r.price, height)  # settled or unverified
        return True


def _apply(s: StateView, tx: Tx) -> None:
    if isinstance(tx, RoundReceipt):
        run = check_round_receipt(s, tx)
        admit_receipt(s, tx)
        record_round_receipt(s, tx, run)
    elif isinstance(tx, RoundAggregate):
        run = check_aggregate(s, tx)
        admit_receipt(s, tx)
        record_aggregate(s, tx, run)
    else:
        apply_run_tx(s, tx)


def _end_block(s: StateView, height: int, block_hash: bytes) -> None:
    end_block_runs(s, height, block_hash, FINAL)


def _height_need(s: StateView) -> str | None:
    """``run``: a waiting or training run's rounds, phase timeouts and deadline count in blocks, and a finishing
    or expired one returns its escrow at the first height at which nothing is held and all its receipts are
    final."""
    for run_id in s.open_runs:
        run = s.runs[run_id]
        if run.status in (RunStatus.WAITING, RunStatus.TRAINING):
            return "run"
        if (run.status in (RunStatus.FINISHING, RunStatus.EXPIRED) and not run.final_height and not run.held
                and not run.decided and all(s.receipts[x].status in FINAL for x in run.receipts)):
            return "run"
    return None


MODULE = Module("runs", txs=RUN_TXS, maps={"runs": Run}, sets=("open_runs",),
                store_keys={"runs": b"n", "open_runs": b"q"}, work_txs=(RoundReceipt, RoundReveal, RoundAggregate),
                on_need=_height_need,
                receipt_kinds={RoundReceipt: _RunReceipts(False), RoundAggregate: _RunReceipts(True)},
                on_apply=_apply, on_end_block=_end_block)


__all__ = [
    "MAX_JOINED",
    "MAX_TIMEOUT_STEPS",
    "TERMINAL",
    "Phase",
    "RoundState",
    "RoundSummary",
    "Run",
    "RunStatus",
    "apply_run_tx",
    "attempt_of",
    "check_aggregate",
    "check_round_receipt",
    "end_block_runs",
    "on_final",
    "phase_timeout",
    "record_aggregate",
    "record_round_receipt",
    "run_floor_ppm",
]
