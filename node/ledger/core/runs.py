"""Collaborative training runs on the ledger: a pure state machine (called from :mod:`node.ledger.core.state`).

Here: the run transactions (post, join, leave, cancel, reveal) and the module; the rounds' progress per block in
:mod:`node.ledger.core.runrounds`, the round receipts and aggregates in :mod:`node.ledger.core.runreceipts`, the
records in :mod:`node.ledger.core.runstate`, the transactions' fields in :mod:`node.ledger.core.runtx`.

A run (:class:`~node.ledger.core.runtx.RunPost`) goes through rounds; each round through phases (:class:`Phase`):

1. **COMMIT** — opened in ``end_block`` of height h when at least ``min_workers`` have joined: the round's
   participants (the first ``max_workers`` joined workers, in join order, then sorted) and its beacon (the hash
   of block h, which nobody knew when they joined) are fixed; the beacon draws each participant's batches
   (:func:`node.training.assign.assign_round`). Participants submit one :class:`RoundReceipt` each. The phase
   closes when all committed or ``round_timeout`` blocks passed.
2. **REVEAL** — at the close, every commitment is sampled (probability ``max(p(worker), sample_ppm,
   floor)``, :func:`.runrounds.run_floor_ppm`; beacon: the closing block's hash) and sampled ones get a
   committee, exactly like other receipts. Only now do workers
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
   (:func:`.runrounds.phase_timeout`; Tendermint likewise lengthens its timeouts with every round of a height).
   Without it, a network whose workers need a little more than ``round_timeout`` to train H steps fails every attempt
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
(:func:`.runrounds.run_floor_ppm`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .jobtx import parse_targets
from .module import Module, admit_receipt
from .runreceipts import _RunReceipts, check_aggregate, check_round_receipt, record_aggregate, record_round_receipt
from .runrounds import _set, end_block_runs
from .runstate import MAX_JOINED, Phase, Run, RunStatus, attempt_of, open_runs, runs_of
from .runtx import (
    CODECS,
    INNER_STATE,
    RUN_TXS,
    TOPK_CODECS,
    TRAINABLE,
    RoundAggregate,
    RoundReceipt,
    RoundReveal,
    RunCancel,
    RunJoin,
    RunLeave,
    RunPost,
)
from .sampling import PPM
from .status import FINAL
from .txbase import InvalidTx, Tx, _check
from .view import StateView

# ------------------------------------------------------------------ transactions

def check_post(s: StateView, tx: RunPost) -> None:
    """Every rule of a run post (raises :class:`InvalidTx`; changes nothing)."""
    height = s.height + 1
    p = s.params
    _check(tx.run_id not in runs_of(s), "a run with this id exists")
    _check(tx.trainable in TRAINABLE, f"trainable must be one of {', '.join(TRAINABLE)}")
    if tx.trainable == "lora":
        _check(1 <= tx.rank <= 256, f"rank must be in 1..256 (got {tx.rank})")
        try:
            parse_targets(tx.targets)
        except ValueError as e:
            raise InvalidTx(str(e)) from None
    _check(tx.codec in CODECS, f"codec must be one of {', '.join(CODECS)}")
    _check(tx.codec not in TOPK_CODECS or 1 <= tx.topk_ppm <= PPM, f"{tx.codec} needs topk_ppm in 1..1e6")
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
    _check(tx.quorum == 0 or tx.min_workers <= tx.quorum <= tx.max_workers,
           "quorum must be 0 (every participant) or in min_workers..max_workers")
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
    rid: Any = getattr(tx, "run_id", None)  # every run transaction but the post names its run (None: no run)
    run: Run = runs_of(s).get(rid)
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


# ------------------------------------------------------------------ the module (node.ledger.core.modules)


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
    for run_id in open_runs(s):
        run = runs_of(s)[run_id]
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


# Phase, RunStatus and attempt_of are imported from here by node.training and node.api (their home is runstate)
__all__ = ["MAX_JOINED", "MODULE", "Phase", "RunStatus", "apply_run_tx", "attempt_of", "check_post"]
