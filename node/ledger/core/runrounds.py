"""Training runs' rounds (:mod:`.runs` holds the design): a round opened among the bonded joined workers, its
commitments sampled when the commit phase closes, its aggregator drawn, its phases timed out
(:func:`phase_timeout`), a failed attempt re-opened, the pay held for a round's receipts resolved, and the per-block
work over every open run (:func:`end_block_runs`). Also the sampling floor of a round receipt
(:func:`run_floor_ppm`) and the state moves shared with the transactions (:mod:`.runs`) and the receipts
(:mod:`.runreceipts`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace

from ...encoding import H
from . import committee as cm, history
from .runstate import TERMINAL, Phase, RoundState, Run, RunStatus, open_runs, runs_of
from .sampling import PPM, is_sampled, sampling_ppm
from .status import SAMPLED
from .view import StateView


def _set(s: StateView, run: Run) -> None:
    rid = run.post.run_id
    runs_of(s)[rid] = run
    if run.status in TERMINAL and run.final_height:  # an expired run stays open until its escrow is returned
        open_runs(s).pop(rid, None)
    else:
        open_runs(s)[rid] = None


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


# ------------------------------------------------------------------ per block

def end_block_runs(s: StateView, height: int, block_hash: bytes, final_status: AbstractSet[str]) -> None:
    """Open rounds, close phases at their ends or timeouts, sample closed commitments, draw aggregators, expire
    runs past their deadline, and return the unspent escrow of ended runs once all their receipts are final."""
    for rid in list(open_runs(s)):
        run = runs_of(s)[rid]
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


QUORUM_GRACE_DIV = 10  # after the quorum, the commit phase waits a tenth as long again (at least one block)


def quorum_closes(s: StateView, run: Run, height: int) -> bool:
    """Whether the commit phase of ``run``'s open round closes at ``height`` by its quorum (``RunPost.quorum``):
    once ``q = min(quorum, participants)`` participants committed, at the block ``g`` after the one whose
    receipt made ``q``, where ``g = max(1, ceil((that height − phase start) / QUORUM_GRACE_DIV))``. So a round
    lasts at most 1.1× (plus a block) what its ``q``-th fastest worker takes, whatever the slower ones do; the
    grace lets a worker a little slower than the quorum still count. False when the run has no quorum (0).

    Straggler policy (issue 40): a receipt that arrives after the close is refused, not folded into the next
    round with a staleness weight. A Δ computed from θ_r and applied at θ_{r+1} needs a delay correction that
    the bit-exact outer step would have to replay (Liu et al., "Asynchronous Local-SGD Training for Language
    Modeling", arXiv 2401.09135, §3: plain asynchronous updates lose to synchronous ones unless the momentum is
    corrected for the delay), and a refused receipt is never paid, so work that was not used costs nothing."""
    cur = run.cur
    assert cur is not None
    q = min(run.post.quorum, len(cur.participants))
    if not run.post.quorum or len(cur.commits) < q:
        return False
    reached: int = sorted(s.receipts[rid].height for _, rid, _ in cur.commits)[q - 1]
    grace = max(1, -(-(reached - cur.phase_height) // QUORUM_GRACE_DIV))
    return height >= reached + grace


def _advance(s: StateView, run: Run, height: int, beacon: bytes) -> Run:
    cur = run.cur
    assert cur is not None
    p = run.post
    timed_out = height >= cur.phase_height + phase_timeout(p.round_timeout, cur.attempt)
    if cur.phase == Phase.COMMIT:
        if len(cur.commits) == len(cur.participants) or timed_out or quorum_closes(s, run, height):
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
