"""Committee re-execution of a fine-tune job's training segment (DESIGN.md, Verification §2; issue: verified
training receipts): the marketplace's :class:`~node.duty.seams.ReceiptChecker`, :class:`TrainingCheck`.

The member fetches the job's dataset (by its content hash, from the worker or the requester), the training
state before the segment and the committed state after it (from the worker), then:

1. for the first segment, rebuilds the initial state from the job's seed and checks ``state_before``;
2. recomputes the segment's batches from the dataset and seed and checks ``batches_root`` — a worker that
   committed batches other than the job's data is caught here;
3. replays the segment's steps from ``state_before`` and compares the result with ``state_after`` by the worst
   relative L2 difference over all state tensors (:func:`node.compute.train.state_distance`) — skipped steps,
   training on other data and fabricated adapters are caught here.

Tolerance: replay is bit-identical at equal thread counts; across thread counts 1 and 2 the measured distance on
the tiny model was 0 and stays far below ``TRAIN_TOLERANCE`` (see ``tests/verify/test_training.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..blobs import fetch_blob
from ..compute.data import dataset_bytes
from ..compute.model import tokenizer_trusted
from ..duty.seams import Member
from ..duty.verdict import CheckResult
from ..encoding import commitments_root
from ..ledger.core.jobstate import jobs_of
from ..ledger.core.jobtx import JobPost, TrainReceipt
from ..ledger.core.tx import ABSTAIN, INVALID, VALID
from .worker import spec_of

if TYPE_CHECKING:
    import torch

    from ..compute.train import Trainer, TrainSpec

log = logging.getLogger("tally.verify")

TRAIN_TOLERANCE = 1e-3

# (model dir, spec, device) -> (the job's trainer, its initial state tensors): one base model at a time
TrainerCache = dict[tuple[str, "TrainSpec", str], tuple["Trainer", list["torch.Tensor"]]]


def _trainer(cache: TrainerCache, model_dir: Path, spec: TrainSpec, device: str) -> tuple[Trainer, list[torch.Tensor]]:
    from ..compute.train import Trainer  # local: it imports torch (~2 s); only a committee replay (executor) needs it

    key = (str(model_dir), spec, device)
    if key not in cache:
        cache.clear()  # one base model in memory at a time
        t = Trainer(model_dir, spec, device)
        cache[key] = (t, t.state_tensors())
    return cache[key]


def replay_segment(model_dir: Path, post: JobPost, text: bytes, r: TrainReceipt, before: list[torch.Tensor],
                   after: list[torch.Tensor], device: str = "cpu",
                   cache: TrainerCache | None = None) -> CheckResult:
    """Re-execute segment ``r`` of job ``post`` (blocking, torch): returns the verdict and the distance
    (:func:`node.compute.train.state_distance` between the committed and the replayed state).

    ``cache``: a dict owned by one caller (one thread at a time) in which the job's Trainer is kept between
    segments, so the base model is loaded once per job rather than once per segment. On a ``model_dir`` whose
    tokenizer came unchecked from a peer (:func:`node.compute.model.tokenizer_trusted`), batches that differ
    from the receipt's give ABSTAIN, not INVALID: the tokenizer may be the wrong one."""
    # local: compute.train imports torch (~2 s); this runs on the executor, where a member replays a segment
    from ..compute.train import batch_for_step, encode_text, split_tokens, state_distance

    spec = spec_of(post)
    trainer, initial = _trainer({} if cache is None else cache, model_dir, spec, device)
    if r.step_start == 0 and commitments_root(initial) != r.state_before:
        return CheckResult(INVALID)  # not the job's initial adapter
    try:
        trainer.load_state(before)
    except ValueError:
        return CheckResult(INVALID)
    if trainer.step != r.step_start:
        return CheckResult(INVALID)
    train_ids, _ = split_tokens(encode_text(model_dir, text))
    batches = [batch_for_step(train_ids, spec, s) for s in range(r.step_start, r.step_end)]
    if commitments_root(batches) != r.batches_root:  # committed batches are not the job's data
        return CheckResult(INVALID if tokenizer_trusted(model_dir) else ABSTAIN)
    trainer.train_steps(train_ids, r.step_start, r.step_end)
    d = state_distance(after, trainer.state_tensors())
    return CheckResult(VALID if d <= TRAIN_TOLERANCE else INVALID, d)


class TrainingCheck:
    """The committee check of fine-tune segments (:class:`~node.ledger.core.jobtx.TrainReceipt`) for one member,
    with the cache in which the job's trainer is kept between segments (see :func:`replay_segment`; the member's
    executor runs one task at a time). ``await check(member, r)`` is :func:`check_training`."""

    def __init__(self) -> None:
        self.cache: TrainerCache = {}

    def checkers(self) -> dict[type, TrainingCheck]:
        """Receipt type -> check, for :class:`node.verify.member.CommitteeMember`'s ``checkers``."""
        return {TrainReceipt: self}

    async def __call__(self, member: Member, r: TrainReceipt, /) -> CheckResult:
        return await check_training(member, r, self.cache)


async def check_training(member: Member, r: TrainReceipt, cache: TrainerCache) -> CheckResult:
    """A committee member's verdict on a training receipt (ABSTAIN when it cannot fetch or replay); ``cache`` as
    in :func:`replay_segment`."""
    job = jobs_of(member.ledger.state).get(r.job_id)
    if job is None:
        return CheckResult(ABSTAIN)
    holders = [r.worker, r.requester]
    model_dir = await member.model_dir_for(job.post.model_id, holders)
    if model_dir is None:
        return CheckResult(ABSTAIN)
    try:
        text = dataset_bytes(await fetch_blob(member.host, member.blobs, job.post.dataset_root, holders))
        before = await fetch_blob(member.host, member.blobs, r.state_before, [r.worker])
        after = await fetch_blob(member.host, member.blobs, r.state_after, [r.worker])
    except (LookupError, ValueError) as e:
        log.info("abstain on training receipt %s: %s", r.id.hex()[:16], e)
        return CheckResult(ABSTAIN)
    try:
        return await member.executor.run(replay_segment, model_dir, job.post, text, r, before, after, "cpu", cache)
    except (RuntimeError, MemoryError) as e:
        log.warning("abstain on training receipt %s: %s", r.id.hex()[:16], e)
        return CheckResult(ABSTAIN)

