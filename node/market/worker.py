"""A worker in the job marketplace: accept a job, fetch its dataset, train segment by segment, receipt each
segment, deliver the adapter by content hash.

Runs on the node's event loop; training runs in the node's torch worker thread. A worker takes one job at a
time. Every segment's training state is kept as a content-addressed blob, so the committee can replay the segment
from the state before it and the requester can fetch the final adapter.
"""

from __future__ import annotations

import logging

import trio

from ..blobs import BlobStore, fetch_blob
from ..compute.train import TrainSpec, Trainer, encode_text, mean_loss_ppm, split_tokens
from ..encoding import H, commitments_root
from ..identity import Identity
from ..ledger.jobs import ACCEPTED, OPEN
from ..ledger.jobtx import JobAccept, JobDeliver, JobPost, TrainReceipt, parse_targets
from .data import dataset_bytes

log = logging.getLogger("tally.market")

def spec_of(post: JobPost) -> TrainSpec:
    return TrainSpec(rank=post.rank, targets=parse_targets(post.targets),
                     steps=post.steps, batch_size=post.batch_size, seq_len=post.seq_len, lr=post.lr_micro / 1e6,
                     seed=post.seed, segment_steps=post.segment_steps)


class JobWorker:
    """Accepts open jobs for this node's model and trains them.

    Args:
        fault: test/devnet switch, one of ``skip-steps``, ``other-data``, ``fake-adapter`` (see
            :mod:`node.compute.train`).
    """

    def __init__(self, ident: Identity, ledger, host, blobs: BlobStore, executor, model_dir, model_id: bytes,
                 device: str = "cpu", fault: str | None = None):
        self.ident, self.ledger, self.host, self.blobs, self.executor = ident, ledger, host, blobs, executor
        self.model_dir, self.model_id, self.device, self.fault = model_dir, model_id, device, fault
        self.busy: bytes | None = None
        self.accepting: dict[bytes, int] = {}  # job id -> height we sent an accept at
        self._wake = trio.Event()
        self.progress: dict[bytes, dict] = {}  # job id -> {"step", "losses"} (local view for the API)
        self.failures: dict[bytes, tuple[int, float]] = {}  # job id -> (failed attempts, monotonic time of next try)
        ledger.on_block(lambda block, state: self._wake.set())

    def _next_action(self) -> tuple[str, object] | None:
        """``("train", job_id)`` for a job accepted by us, else ``("accept", JobAccept)`` for an open job of our
        model when idle (re-sent if not accepted within 10 blocks), else None."""
        st = self.ledger.state
        for jid in st.open_jobs:
            job = st.jobs[jid]
            if job.status == ACCEPTED and job.worker == self.ident.account:
                return "train", jid
        if self.busy is not None:
            return None
        # each worker prefers open jobs in its own pseudo-random order, so idle workers spread over open jobs
        for jid in sorted(st.open_jobs, key=lambda j: H(j, self.ident.account)):
            job = st.jobs[jid]
            sent = self.accepting.get(jid)
            if (job.status == OPEN and job.post.model_id == self.model_id and job.post.sender != self.ident.account
                    and (sent is None or st.height - sent > 10)):
                self.accepting[jid] = st.height
                nonce = self.ledger.next_nonce(self.ident.account)
                return "accept", JobAccept(self.ledger.chain_id, self.ident.account, jid, nonce).signed(self.ident)
        return None

    async def run(self) -> None:
        """Forever: accept an open job when idle, train the job we hold."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self.ledger.state.account(self.ident.account).bond < self.ledger.genesis.params.min_bond:
                continue
            for jid in [j for j in self.failures if j not in self.ledger.state.open_jobs]:
                del self.failures[jid]  # cancelled, expired or otherwise final: nothing left to retry
            action = self._next_action()
            if action is None:
                continue
            kind, what = action
            if kind == "accept":
                log.info("accepting job %s", what.job_id.hex()[:12])
                await self.ledger.submit(what)
            elif self.busy is None and trio.current_time() >= self.failures.get(what, (0, 0.0))[1]:
                self.busy = what
                try:
                    await self.train(what)
                    self.failures.pop(what, None)
                except Exception as e:  # retried with exponential backoff (2 s .. 5 min), full traceback once
                    n = self.failures.get(what, (0, 0.0))[0] + 1
                    delay = min(300.0, 2.0 ** min(n, 9))
                    self.failures[what] = (n, trio.current_time() + delay)
                    if n == 1:
                        log.exception("training job %s failed; retrying in %.0f s", what.hex()[:12], delay)
                    else:
                        log.warning("training job %s failed again (attempt %d: %s: %s); retrying in %.0f s",
                                    what.hex()[:12], n, type(e).__name__, e, delay)
                finally:
                    self.busy = None

    async def _wait_included(self, tid: bytes, timeout: float = 120) -> None:
        with trio.fail_after(timeout):
            while tid not in self.ledger.state.receipts:
                await self.ledger.new_block.wait()

    async def train(self, jid: bytes) -> None:
        """Train job ``jid`` from where the ledger says it stands to the end, then deliver."""
        job = self.ledger.state.jobs[jid]
        post = job.post
        spec = spec_of(post)
        text = dataset_bytes(await fetch_blob(self.host, self.blobs, post.dataset_root, [post.sender]))
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
            end = min(post.steps, step + post.segment_steps)
            losses, batches = await self.executor.run(trainer.train_steps, train_ids, step, end, self.fault)
            after = await self.executor.run(self._put_state, trainer)
            loss = mean_loss_ppm(losses)
            r = TrainReceipt(self.ledger.chain_id, jid, self.ident.account, post.sender, step, end, before, after,
                             commitments_root(batches), loss, (end - step) * post.price_per_step)
            r = r.signed(self.ident)
            await self.ledger.submit(r)
            prog["step"], prog["losses"] = end, prog["losses"] + losses
            log.info("job %s: steps %d-%d, loss %s", jid.hex()[:12], step, end,
                     "NaN" if loss < 0 else f"{loss / 1e6:.3f}")
            await self._wait_included(r.id)
            if loss < 0:
                return  # diverged: the ledger refunds the rest
            before, step = after, end
        tx = JobDeliver(self.ledger.chain_id, self.ident.account, jid, before, self.ledger.next_nonce(self.ident.account))
        await self.ledger.submit(tx.signed(self.ident))
        log.info("job %s delivered: adapter %s", jid.hex()[:12], before.hex()[:16])

    def _put_state(self, trainer: Trainer) -> bytes:
        return self.blobs.put(trainer.state_tensors())
