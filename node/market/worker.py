"""A worker in the job marketplace: fetch and check a job's dataset, accept the job, train segment by segment,
receipt each segment, deliver the adapter by content hash.

Runs on the node's event loop; training runs in the node's torch worker thread. A worker holds at most
``capacity`` jobs at once (``node start --job-capacity N``; the ledger further bounds it by the bond, see
:mod:`node.ledger.core.jobs`). It accepts a job only after it has fetched the dataset by content hash from the
requester and checked that it decodes and holds at least one training window, so a requester that went offline
or never had its dataset cannot make it accept a job it could not start: such a job is skipped and retried with
exponential backoff (logged once). An accepted job it cannot start — its dataset gone after all, or training
that keeps failing — is given back with a ``job_release`` before its first segment, which costs the bond less
than letting the ledger's start window take it back. Every segment's training state is kept as a
content-addressed blob, so the committee can replay the segment from the state before it and the requester can
fetch the final adapter.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..blobs import BlobStore, BlobUnavailable, fetch_blob
from ..compute.data import dataset_bytes
from ..compute.executor import load_torch
from ..duty.parts import NodeParts
from ..duty.runner import DutyRunner
from ..duty.seams import Executor, Host, Ledger
from ..encoding import H, commitments_root
from ..identity import Identity
from ..ledger.core.jobstate import ACCEPTED, OPEN, jobs_of, open_jobs
from ..ledger.core.jobtx import JobAccept, JobDeliver, JobPost, JobRelease, TrainReceipt, parse_targets
from ..ledger.core.state import State
from ..ledger.core.tx import InvalidTx
from .settings import TRAIN_FAULTS, MarketSettings

if TYPE_CHECKING:
    from ..compute.train import Trainer, TrainSpec

log = logging.getLogger("tally.market")

FETCH_TIMEOUT = 20.0  # seconds to wait for a requester's dataset before skipping its job for now
PREFETCH_PARALLEL = 4  # datasets fetched at once (a silent requester must not delay the next job's fetch)
RELEASE_AFTER = 3  # failed training attempts of a job without a segment before the worker releases it
RESEND_BLOCKS = 10  # an accept or release not on the ledger after this many blocks is sent again


def spec_of(post: JobPost) -> TrainSpec:
    from ..compute.train import TrainSpec  # local: compute.train imports torch (~2 s); only a job's work needs it

    return TrainSpec(rank=post.rank, targets=parse_targets(post.targets),
                     steps=post.steps, batch_size=post.batch_size, seq_len=post.seq_len, lr=post.lr_micro / 1e6,
                     seed=post.seed, segment_steps=post.segment_steps)


def backoff(attempts: int) -> float:
    """Seconds to wait after ``attempts`` consecutive failures: 2, 4, 8 … capped at 5 minutes (no overflow)."""
    return min(300.0, 2.0 ** min(attempts, 9))


class JobLost(RuntimeError):
    """The job stopped being ours while we trained it (released, taken back by the start window, expired)."""


class JobWorker:
    """Accepts open jobs for this node's model, up to ``capacity`` at once, and trains them.

    Args:
        capacity: jobs held at once (>= 1).
        fault: test/devnet switch, one of ``skip-steps``, ``other-data``, ``fake-adapter`` (see
            :mod:`node.compute.train`).

    Raises:
        ValueError: ``capacity < 1``.
    """

    def __init__(self, ident: Identity, ledger: Ledger, host: Host, blobs: BlobStore, executor: Executor,
                 model_dir: Path, model_id: bytes, device: str = "cpu", fault: str | None = None,
                 capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"job capacity must be >= 1 (got {capacity})")
        self.ident, self.ledger, self.host, self.blobs, self.executor = ident, ledger, host, blobs, executor
        self.model_dir, self.model_id, self.device, self.fault = model_dir, model_id, device, fault
        self.capacity = capacity
        self.training: set[bytes] = set()  # job ids with a training task running
        self.fetching: set[bytes] = set()  # job ids whose dataset is being fetched before acceptance
        self.ready: set[bytes] = set()  # open jobs whose dataset is here and checked: accept when there is room
        self.unusable: set[bytes] = set()  # open jobs whose dataset arrived but cannot be trained on (never retried)
        self.accepting: dict[bytes, int] = {}  # job id -> height we sent an accept at
        self.releasing: dict[bytes, int] = {}  # job id -> height we sent a release at
        self.delivering: dict[bytes, int] = {}  # job id -> height we sent the delivery at
        self.skipped: dict[bytes, tuple[int, float]] = {}  # job id -> (failed fetches, trio time of next try)
        self.failures: dict[bytes, tuple[int, float]] = {}  # job id -> (failed trainings, trio time of next try)
        self.progress: dict[bytes, dict[str, Any]] = {}  # job id -> {"step", "losses"} (local view for the API)
        self.duty_runner = DutyRunner(self, ledger)  # steps at each block, and when a dataset is checked

    @classmethod
    def from_parts(cls, parts: NodeParts, settings: MarketSettings) -> JobWorker | None:
        """The node's job worker (:class:`node.duty.parts.NodeParts`), or None unless ``settings.accept_jobs``; a
        ``config.fault`` of :data:`TRAIN_FAULTS` makes it cheat (test and devnet chains)."""
        if not settings.accept_jobs:
            return None
        cfg = parts.config
        return cls(parts.ident, parts.ledger, parts.host, parts.blobs, parts.executor, cfg.model_dir, parts.model_id,
                   device=cfg.device, fault=cfg.fault if cfg.fault in TRAIN_FAULTS else None,
                   capacity=settings.job_capacity)

    # ------------------------------------------------------------------ the loop

    @property
    def name(self) -> str:
        """The duty's name in logs (:class:`node.duty.runner.Duty`)."""
        return "job worker"

    async def run(self) -> None:
        """Forever, at each block: train the jobs we hold, fetch datasets of open jobs, accept while there is room
        (:class:`node.duty.runner.DutyRunner`)."""
        await self.duty_runner.run()

    def _held(self, st: State) -> list[bytes]:
        me = self.ident.account
        return [jid for jid in open_jobs(st) if (j := jobs_of(st)[jid]).status == ACCEPTED and j.worker == me]

    def _forget_final(self, st: State) -> None:
        """Drop local records of jobs that left the open set (final) or are no longer waiting for us."""
        for d in (self.failures, self.skipped, self.accepting, self.releasing, self.delivering):
            for jid in [j for j in d if j not in open_jobs(st)]:
                del d[jid]
        for s in (self.ready, self.unusable):
            s.intersection_update(open_jobs(st))

    def _wanted(self, st: State, jid: bytes) -> bool:
        """An open job of our model, not ours to pay for, not one we lost before, not past its deadline."""
        job = jobs_of(st)[jid]
        me = self.ident.account
        return (job.status == OPEN and job.post.model_id == self.model_id and job.post.sender != me
                and st.height < job.post.deadline and all(d[0] != me for d in job.dropped)
                and jid not in self.unusable)

    async def step(self, nursery: trio.Nursery) -> None:
        """One look at the state (:class:`node.duty.runner.Duty`): (re)start training the jobs this node holds,
        resend an accept or release that did not land, and while there is room accept open jobs whose dataset is
        checked, or start fetching one."""
        st = self.ledger.state
        me = self.ident.account
        if st.account(me).bond < self.ledger.genesis.params.min_bond:
            return
        self._forget_final(st)
        now = trio.current_time()
        held = self._held(st)
        for jid in held:
            self.accepting.pop(jid, None)
            if jid in self.releasing:
                if st.height - self.releasing[jid] > RESEND_BLOCKS:
                    await self._release(jid, "the earlier release did not reach the ledger")
                continue
            if jid in self.delivering and st.height - self.delivering[jid] <= RESEND_BLOCKS:
                continue  # delivered; waiting for the delivery to land
            if jid not in self.training and now >= self.failures.get(jid, (0, 0.0))[1]:
                self.training.add(jid)
                nursery.start_soon(self._train_task, jid)
        jobs = jobs_of(st)
        for jid in [j for j, h in self.accepting.items() if jobs[j].status != OPEN or st.height - h > RESEND_BLOCKS]:
            del self.accepting[jid]  # taken by someone else, or lost: may be tried again
        free = self.capacity - len(held) - len(self.accepting)
        if free <= 0:
            return
        # each worker prefers open jobs in its own pseudo-random order, so idle workers spread over open jobs
        for jid in sorted(open_jobs(st), key=lambda j: H(j, me)):
            if free <= 0:
                break
            if jid in self.accepting or not self._wanted(st, jid):
                continue
            if jid in self.ready:
                free -= 1
                self.ready.discard(jid)
                self.accepting[jid] = st.height
                log.info("accepting job %s (dataset fetched and checked)", jid.hex()[:12])
                tx = JobAccept(self.ledger.chain_id, me, jid, self.ledger.next_nonce(me)).signed(self.ident)
                await self._submit(tx)
            elif (jid not in self.fetching and len(self.fetching) < PREFETCH_PARALLEL
                  and now >= self.skipped.get(jid, (0, 0.0))[1]):
                self.fetching.add(jid)
                nursery.start_soon(self._prefetch, jid)

    # ------------------------------------------------------------------ before accepting

    async def check_dataset(self, post: JobPost) -> None:
        """Fetch ``post``'s dataset by content hash from its requester (kept in the blob store for training) and
        check it: one uint8 tensor whose training tokens hold at least one window of ``seq_len + 1``.

        Raises:
            BlobUnavailable: the requester did not return it (offline, missing, wrong content).
            ValueError: it arrived but cannot be trained on.
        """
        await load_torch(self.executor)  # then the imports below, and decoding the dataset, do not stall the loop
        from ..compute.train import encode_text, split_tokens  # local: it imports torch (~2 s); see spec_of

        tensors = await fetch_blob(self.host, self.blobs, post.dataset_root, [post.sender], timeout=FETCH_TIMEOUT)
        text = dataset_bytes(tensors)
        train_ids, _ = split_tokens(await self.executor.run(encode_text, self.model_dir, text))
        if len(train_ids) < post.seq_len + 2:
            raise ValueError(f"dataset too short: {len(train_ids)} training tokens for windows of {post.seq_len + 1}")

    async def _prefetch(self, jid: bytes) -> None:
        post = jobs_of(self.ledger.state)[jid].post
        try:
            with trio.fail_after(FETCH_TIMEOUT + 30):  # the fetch itself, then tokenizing
                await self.check_dataset(post)
        except ValueError as e:  # the content is fixed by its hash: it will never do
            self.unusable.add(jid)
            log.info("skipping job %s for good: its dataset cannot be trained on (%s: %s)", jid.hex()[:12],
                     type(e).__name__, e)
        except Exception as e:  # noqa: BLE001 - unavailable (requester offline, blob missing), too slow, local error
            n = self.skipped.get(jid, (0, 0.0))[0] + 1
            delay = backoff(n)
            self.skipped[jid] = (n, trio.current_time() + delay)
            (log.info if n == 1 else log.debug)(
                "skipping job %s: its dataset cannot be fetched and checked (%s: %s); not accepting it, "
                "retrying in %.0f s (attempt %d)", jid.hex()[:12], type(e).__name__, e, delay, n)
        else:
            self.skipped.pop(jid, None)
            self.ready.add(jid)
        finally:
            self.fetching.discard(jid)
            self.duty_runner.wake()

    # ------------------------------------------------------------------ holding a job

    async def release(self, jid: bytes, why: str) -> bytes | None:
        """Give back accepted job ``jid`` (before its first segment) with a ``job_release``; returns the tx id, or
        None when the local node refused it (logged; sent again after :data:`RESEND_BLOCKS` blocks). The job stops
        being trained here. The ledger refuses it once a segment is on the ledger."""
        return await self._release(jid, why)

    async def _release(self, jid: bytes, why: str) -> bytes | None:
        me = self.ident.account
        self.releasing[jid] = self.ledger.state.height
        log.warning("releasing job %s before its first segment: %s", jid.hex()[:12], why)
        tx = JobRelease(self.ledger.chain_id, me, jid, self.ledger.next_nonce(me)).signed(self.ident)
        return await self._submit(tx)

    async def _submit(self, tx: JobAccept | JobRelease) -> bytes | None:
        """Submit ``tx``; a refusal (e.g. a full mempool) is logged and left to the resend after ``RESEND_BLOCKS``."""
        try:
            return await self.ledger.submit(tx)
        except InvalidTx as e:  # an accept racing another worker's is routine; anything else is worth a warning
            (log.info if isinstance(tx, JobAccept) else log.warning)(
                "%s for job %s refused by the local node: %s", tx.KIND, tx.job_id.hex()[:12], e)
            return None

    def _unstarted(self, jid: bytes) -> bool:
        job = jobs_of(self.ledger.state).get(jid)
        return job is not None and job.status == ACCEPTED and job.worker == self.ident.account and not job.segments

    async def _train_task(self, jid: bytes) -> None:
        try:
            await self.train(jid)
            self.failures.pop(jid, None)
        except JobLost as e:
            log.info("stopped training job %s: %s", jid.hex()[:12], e)
        except Exception as e:
            n = self.failures.get(jid, (0, 0.0))[0] + 1
            if self._unstarted(jid) and (isinstance(e, BlobUnavailable) or n >= RELEASE_AFTER):
                self.failures[jid] = (n, trio.current_time() + backoff(n))
                await self._release(jid, f"training failed {n} time(s), last {type(e).__name__}: {e}")
                return
            delay = backoff(n)  # retried with exponential backoff (2 s .. 5 min), full traceback once
            self.failures[jid] = (n, trio.current_time() + delay)
            if n == 1:
                log.exception("training job %s failed; retrying in %.0f s", jid.hex()[:12], delay)
            else:
                log.warning("training job %s failed again (attempt %d: %s: %s); retrying in %.0f s",
                            jid.hex()[:12], n, type(e).__name__, e, delay)
        finally:
            self.training.discard(jid)

    def _check_ours(self, jid: bytes) -> None:
        job = jobs_of(self.ledger.state).get(jid)
        if jid in self.releasing or job is None or job.status != ACCEPTED or job.worker != self.ident.account:
            raise JobLost(f"job is {job.status if job else 'unknown'} and not held by this worker")

    async def _wait_included(self, jid: bytes, tid: bytes, timeout: float = 120) -> None:
        with trio.fail_after(timeout):
            while tid not in self.ledger.state.receipts:
                self._check_ours(jid)
                await self.ledger.new_block.wait()

    async def train(self, jid: bytes) -> None:
        """Train job ``jid`` from where the ledger says it stands to the end, then deliver.

        Raises:
            JobLost: the job stopped being ours. BlobUnavailable: dataset or last state unavailable. Anything the
            trainer raises.
        """
        job = jobs_of(self.ledger.state)[jid]
        post = job.post
        if job.next_step >= post.steps:  # every segment is on the ledger: only the delivery is missing
            return await self._deliver(jid, job.last_state)
        await load_torch(self.executor)  # then the imports below, and decoding the dataset, do not stall the loop
        # local: compute.train imports torch (~2 s); only a worker that trains a job needs it
        from ..compute.train import Trainer, encode_text, mean_loss_ppm, split_tokens

        spec = spec_of(post)
        text = dataset_bytes(await fetch_blob(self.host, self.blobs, post.dataset_root, [post.sender],
                                              timeout=FETCH_TIMEOUT))
        ids = await self.executor.run(encode_text, self.model_dir, text)
        train_ids, _ = split_tokens(ids)
        trainer = await self.executor.run(Trainer, self.model_dir, spec, self.device)
        if job.segments:  # resume from the last receipted state
            state = await fetch_blob(self.host, self.blobs, job.last_state, [self.ident.account])
            await self.executor.run(trainer.load_state, state)
        before = await self.executor.run(self._put_state, trainer)
        prog = self.progress.setdefault(jid, {"step": job.next_step, "losses": []})
        step = job.next_step
        while step < post.steps:
            self._check_ours(jid)
            end = min(post.steps, step + post.segment_steps)
            losses, batches = await self.executor.run(trainer.train_steps, train_ids, step, end, self.fault)
            after = await self.executor.run(self._put_state, trainer)
            loss = mean_loss_ppm(losses)
            r = TrainReceipt(self.ledger.chain_id, jid, self.ident.account, post.sender, step, end, before, after,
                             commitments_root(batches), loss, (end - step) * post.price_per_step)
            r = r.signed(self.ident)
            self._check_ours(jid)
            await self.ledger.submit(r)
            prog["step"], prog["losses"] = end, prog["losses"] + losses
            log.info("job %s: steps %d-%d, loss %s", jid.hex()[:12], step, end,
                     "NaN" if loss < 0 else f"{loss / 1e6:.3f}")
            await self._wait_included(jid, r.id)
            if loss < 0:
                return  # diverged: the ledger refunds the rest
            before, step = after, end
        await self._deliver(jid, before)

    async def _deliver(self, jid: bytes, adapter: bytes) -> None:
        me = self.ident.account
        self.delivering[jid] = self.ledger.state.height
        await self.ledger.submit(JobDeliver(self.ledger.chain_id, me, jid, adapter, self.ledger.next_nonce(me))
                                 .signed(self.ident))
        log.info("job %s delivered: adapter %s", jid.hex()[:12], adapter.hex()[:16])

    def _put_state(self, trainer: Trainer) -> bytes:
        return self.blobs.put(trainer.state_tensors())
