"""The fine-tune job marketplace's state transition (pure; called from :mod:`node.ledger.core.state`).

Money (base units): posting moves ``steps × price_per_step`` from the requester's balance into escrow
(``Job.escrow_left``). Each training receipt reserves its price from ``escrow_left``; the reserved amount stays in
the requester's escrow until the receipt is final and then moves exactly like an inference receipt's (worker and
committee paid on a valid verdict or after the challenge window; refunded and the worker slashed on an invalid
one). Cancel (before acceptance), expiry (deadline passed without delivery), divergence (a non-finite loss) and
failure (an invalid segment) refund whatever is not reserved. A training receipt for a job that is not accepted
— late, after delivery, expiry or settlement — is refused, so the total paid never exceeds the agreed price.

Liveness (nobody holds a job hostage; genesis parameters in :class:`node.ledger.genesis.Params`):

* a post's deadline is at most ``max_job_deadline`` blocks after the block that includes it;
* an accepted job whose first segment receipt is not on the ledger by the end of block
  ``accepted_height + job_start_window`` returns to open, and the worker's bond pays ``job_start_penalty``;
* before its first segment the worker may give the job back (:class:`JobRelease`) for the smaller
  ``job_release_penalty``; after it, it cannot (the job is delivered or expires at its deadline);
* a worker that timed out on or released a job cannot accept that job again (another worker's turn, so one key
  cannot hold one job window after window);
* a worker's bond must cover ``job_start_penalty`` for every job it holds without a first segment: accepting one
  more needs ``bond >= job_start_penalty × (unstarted jobs held + 1)`` (besides ``min_bond``), and an unbond may
  not leave less. This is the ledger's capacity bound: a key that holds K jobs hostage loses exactly
  K × ``job_start_penalty`` per start window and can hold no more than its bond pays for. (A count cap alone would
  not do: an attacker could keep accepting after its bond was drained to nothing and pay nothing.)

Penalties go to the treasury, like the part of a slash that rewards nobody, not to the requester: a requester
paid for a worker's missed start window would gain from posting jobs built to be missed (an unfetchable dataset
served to one worker, a segment too large for the window), while the requester's own loss is only time, bounded
by the window; and a requester colluding with its worker would gain nothing either way. Every penalty moves
base units from a bond to the treasury's balance, so the supply (balances + bonds + escrow) is unchanged.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace

from . import history
from .genesis import TREASURY
from .jobparams import JOB_PART
from .jobstate import (
    ACCEPTED,
    CANCELLED,
    DELIVERED,
    DIVERGED,
    EXPIRED,
    FAILED,
    OPEN,
    RELEASED,
    SETTLED,
    START_TIMEOUT,
    TERMINAL,
    Job,
    jobs_of,
    open_jobs,
)
from .jobtx import JOB_TXS, JobAccept, JobCancel, JobDeliver, JobPost, JobRelease, TrainReceipt, parse_targets
from .module import Module, PlainReceipt, admit_receipt
from .status import FINAL
from .txbase import InvalidTx, Tx, Verdict, _check
from .view import StateView


def _refund_left(s: StateView, job: Job, status: str, height: int) -> Job:
    left = job.escrow_left
    if left:
        req = s.account(job.post.sender)
        s.accounts[job.post.sender] = replace(req, balance=req.balance + left, escrow=req.escrow - left)
    history.schedule_owner_leave(s, job.segments, height, FINAL)
    return replace(job, status=status, escrow_left=0, refunded=job.refunded + left, final_height=height)


def _set(s: StateView, job: Job) -> None:
    jid = job.post.job_id
    jobs_of(s)[jid] = job
    if job.status in TERMINAL:
        open_jobs(s).pop(jid, None)
    else:
        open_jobs(s)[jid] = None


def unstarted_held(s: StateView, worker: bytes) -> int:
    """How many jobs ``worker`` holds accepted without a first segment (each backed by ``job_start_penalty``)."""
    return sum(1 for jid in open_jobs(s)
               if (j := jobs_of(s)[jid]).status == ACCEPTED and j.worker == worker and not j.segments)


def _reopen(s: StateView, job: Job, reason: str, penalty: int, height: int) -> Job:
    """Take ``job`` from its worker (before its first segment): back to open; ``min(bond, penalty)`` base units
    move from the worker's bond to the treasury."""
    acc = s.account(job.worker)
    paid = min(acc.bond, penalty)
    s.accounts[job.worker] = replace(acc, bond=acc.bond - paid)
    t = s.account(TREASURY)
    s.accounts[TREASURY] = replace(t, balance=t.balance + paid)
    return replace(job, status=OPEN, worker=b"", accepted_height=0,
                   dropped=job.dropped + ((job.worker, reason, height, paid),))


def apply_job_tx(s: StateView, tx: Tx) -> None:
    """Apply a marketplace transaction to ``s`` in place (checks first; a refused tx changes nothing). The
    caller, :func:`node.ledger.core.state.apply_tx`, checks and advances the sender's nonce.

    Raises:
        InvalidTx: as documented per kind in :mod:`node.ledger.core.jobtx`.
    """
    height = s.height + 1
    if isinstance(tx, JobPost):
        _check(tx.job_id not in jobs_of(s), "a job with this id exists")
        _check(1 <= tx.steps <= 100_000 and 1 <= tx.segment_steps <= tx.steps,
               f"steps must be in 1..100000 and segment_steps in 1..steps (got steps {tx.steps}, "
               f"segment_steps {tx.segment_steps})")
        _check(1 <= tx.batch_size <= 256 and 2 <= tx.seq_len <= 8192, "batch_size 1..256, seq_len 2..8192")
        _check(1 <= tx.rank <= 256, f"rank must be in 1..256 (got {tx.rank})")
        try:
            parse_targets(tx.targets)
        except ValueError as e:
            raise InvalidTx(str(e)) from None
        _check(1 <= tx.lr_micro <= 10**7 and tx.price_per_step >= 1, "lr_micro >= 1, price_per_step >= 1")
        _check(tx.deadline > height, "deadline already passed")
        _check(tx.deadline - height <= s.params.max_job_deadline,
               f"deadline is {tx.deadline - height} blocks after the post; this chain allows at most "
               f"max_job_deadline = {s.params.max_job_deadline} blocks")
        _check(0 <= tx.sample_ppm <= 1_000_000, "sample_ppm in 0..1e6")
        _check(tx.segment_steps * tx.price_per_step <= s.params.max_receipt_price,
               "a segment's price (segment_steps × price_per_step) exceeds max_receipt_price")
        acc = s.account(tx.sender)
        _check(acc.balance >= tx.price, "balance cannot cover the job's price")
        s.accounts[tx.sender] = replace(acc, balance=acc.balance - tx.price, escrow=acc.escrow + tx.price)
        _set(s, Job(post=tx, height=height, escrow_left=tx.price))
    elif isinstance(tx, JobAccept):
        job = jobs_of(s).get(tx.job_id)
        _check(job is not None, "unknown job")
        _check(job.status == OPEN, f"job is {job.status}")
        _check(tx.sender != job.post.sender, "the requester cannot accept its own job")
        bond = s.account(tx.sender).bond
        _check(bond >= s.params.min_bond, "worker is not bonded")
        _check(height <= job.post.deadline, "deadline passed")
        _check(all(d[0] != tx.sender for d in job.dropped),
               "this worker already held this job and lost it before its first segment; it cannot accept it again")
        held = unstarted_held(s, tx.sender)
        _check(bond >= s.params.job_start_penalty * (held + 1),
               f"the bond covers the start penalty of {bond // max(1, s.params.job_start_penalty)} unstarted jobs and "
               f"this worker holds {held}: bond more, or start one of them first")
        _set(s, replace(job, status=ACCEPTED, worker=tx.sender, accepted_height=height))
    elif isinstance(tx, JobCancel):
        job = jobs_of(s).get(tx.job_id)
        _check(job is not None and job.post.sender == tx.sender, "no such job of yours")
        _check(job.status == OPEN, f"only an open job can be cancelled; this one is {job.status}")
        _set(s, _refund_left(s, job, CANCELLED, height))
    elif isinstance(tx, JobDeliver):
        job = jobs_of(s).get(tx.job_id)
        _check(job is not None and job.worker == tx.sender, "no such job of yours")
        _check(job.status == ACCEPTED, f"job is {job.status}")
        _check(job.next_step == job.post.steps, f"only {job.next_step} of {job.post.steps} steps receipted")
        _check(tx.adapter == job.last_state, "delivered adapter is not the last segment's state")
        _set(s, replace(job, status=DELIVERED, adapter=tx.adapter))
    elif isinstance(tx, JobRelease):
        job = jobs_of(s).get(tx.job_id)
        _check(job is not None and job.worker == tx.sender and job.status == ACCEPTED,
               "no accepted job of yours with this id")
        _check(not job.segments, "the job has started (a segment is on the ledger): it can no longer be released; "
                                 "deliver it or let it reach its deadline")
        _set(s, _reopen(s, job, RELEASED, s.params.job_release_penalty, height))


def check_train_receipt(s: StateView, r: TrainReceipt) -> Job:
    """Checks of a training receipt against its job (before anything moves). Returns the job."""
    job: Job = jobs_of(s).get(r.job_id)
    _check(job is not None, "training receipt for an unknown job")
    _check(job.status == ACCEPTED, f"job is {job.status}: no more training receipts are paid")
    p = job.post
    _check(r.worker == job.worker and r.requester == p.sender, "worker or requester does not match the job")
    _check(r.step_start == job.next_step, f"segment must start at step {job.next_step}")
    _check(r.step_start < r.step_end <= p.steps and r.step_end - r.step_start <= p.segment_steps,
           "segment step range")
    _check(not job.segments or r.state_before == job.last_state, "state_before is not the previous state_after")
    _check(r.price == (r.step_end - r.step_start) * p.price_per_step, "price must be steps × price_per_step")
    _check(r.price <= job.escrow_left, "segment price exceeds the job's remaining escrow")
    _check(r.price <= s.params.max_receipt_price, "segment price above max_receipt_price")
    return job


def record_train_receipt(s: StateView, r: TrainReceipt, job: Job) -> None:
    """Reserve the segment's price and advance the job (after :func:`check_train_receipt`)."""
    height = s.height + 1
    job = replace(job, escrow_left=job.escrow_left - r.price, segments=job.segments + (r.id,),
                  next_step=r.step_end, last_state=r.state_after, losses=job.losses + (r.loss_ppm,))
    if r.loss_ppm < 0:
        job = _refund_left(s, job, DIVERGED, height)
    _set(s, job)


def on_final(s: StateView, r: TrainReceipt, valid: bool, height: int) -> None:
    """A training receipt reached a final status: an invalid one fails its job and refunds unspent escrow."""
    job = jobs_of(s)[r.job_id]
    if not valid and job.status not in (FAILED,):
        job = _refund_left(s, job, FAILED, height)
        _set(s, job)


def end_block_jobs(s: StateView, height: int, final_status: AbstractSet[str]) -> None:
    """Expire undelivered jobs past their deadline; return to open (the worker paying ``job_start_penalty``)
    accepted jobs with no segment by the end of block ``accepted_height + job_start_window``; settle delivered
    jobs whose segments are all final."""
    for jid in list(open_jobs(s)):
        job = jobs_of(s)[jid]
        if job.status in (OPEN, ACCEPTED) and height > job.post.deadline:
            _set(s, _refund_left(s, job, EXPIRED, height))
        elif (job.status == ACCEPTED and not job.segments
              and height >= job.accepted_height + s.params.job_start_window):
            _set(s, _reopen(s, job, START_TIMEOUT, s.params.job_start_penalty, height))
        elif job.status == DELIVERED and all(s.receipts[r].status in final_status for r in job.segments):
            _set(s, _refund_left(s, job, SETTLED, height))


# ------------------------------------------------------------------ the module (node.ledger.core.modules)


class _TrainReceipts(PlainReceipt):
    """Training receipts: sampled at least at their job's ``sample_ppm``; an invalid one fails its job."""

    def sample_ppm(self, s: StateView, r: TrainReceipt, ppm: int) -> int:
        need: int = jobs_of(s)[r.job_id].post.sample_ppm  # the job may require a higher rate
        return max(ppm, need)

    def finalized(self, s: StateView, r: TrainReceipt, verdict: Verdict, owed: int, height: int) -> None:
        on_final(s, r, verdict == Verdict.VALID, height)

    def owner_final(self, s: StateView, r: TrainReceipt) -> int | None:
        job = jobs_of(s).get(r.job_id)
        return int(job.final_height or 0) if job is not None else 0


def _apply(s: StateView, tx: Tx) -> None:
    if isinstance(tx, TrainReceipt):
        job = check_train_receipt(s, tx)
        admit_receipt(s, tx)
        record_train_receipt(s, tx, job)
    else:
        apply_job_tx(s, tx)


def _end_block(s: StateView, height: int, _block_hash: bytes) -> None:
    end_block_jobs(s, height, FINAL)


def _unbond_blocker(s: StateView, worker: bytes, bond_after: int) -> str | None:
    held = unstarted_held(s, worker)
    if bond_after >= s.params.job_start_penalty * held:
        return None
    return f"the bond must keep covering the start penalty of the {held} job(s) this worker holds unstarted"


def _height_need(s: StateView) -> str | None:
    """``job``: an open or accepted job's deadline or start window counts in blocks, and a delivered one settles
    at the first height at which all its segments are final."""
    for jid in open_jobs(s):
        job = jobs_of(s)[jid]
        if job.status in (OPEN, ACCEPTED):
            return "job"
        if job.status == DELIVERED and all(s.receipts[r].status in FINAL for r in job.segments):
            return "job"
    return None


MODULE = Module("jobs", txs=JOB_TXS, maps={"jobs": Job}, sets=("open_jobs",),
                store_keys={"jobs": b"j", "open_jobs": b"p"},
                work_txs=(JobAccept, JobDeliver, JobRelease, TrainReceipt), params=JOB_PART, on_need=_height_need,
                receipt_kinds={TrainReceipt: _TrainReceipts()}, on_apply=_apply, on_end_block=_end_block,
                on_unbond=_unbond_blocker)
