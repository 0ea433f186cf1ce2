"""The requester's side of the marketplace: post a job with its dataset, follow it, fetch the adapter.

The adapter is fetched by content hash (the final training state's Merkle root, checked on arrival) and written
as a standard peft adapter (``adapter_model.safetensors`` + ``adapter_config.json``) that
``peft.PeftModel.from_pretrained`` loads on top of the base model.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..blobs import fetch_blob
from ..compute.data import dataset_bytes, dataset_tensors
from ..compute.executor import load_torch
from ..encoding import format_amount
from ..identity import account_to_str
from ..ledger.core.jobstate import ACCEPTED, STATUS_TEXT, Job, JobStatus, jobs_of
from ..ledger.core.jobtx import JobPost
from ..ledger.core.state import State, apply_tx
from ..ledger.core.tx import InvalidTx
from ..web.deps import CapabilityNode
from .worker import spec_of

if TYPE_CHECKING:
    import torch


class JobError(ValueError):
    """A job request that cannot be carried out (bad parameters, unknown job, not delivered yet)."""


async def post_job(node: CapabilityNode, *, title: str, text: bytes, steps: int, price_per_step: int,
                   batch_size: int = 4, seq_len: int = 64, rank: int = 8, targets: str = "q_proj,v_proj",
                   lr: float = 1e-3, seed: int = 0, segment_steps: int | None = None, deadline_blocks: int = 2000,
                   sample_ppm: int = 0) -> JobPost:
    """Store the dataset as a blob and submit a :class:`JobPost` escrowing ``steps × price_per_step``
    (base units). ``segment_steps`` defaults to ``min(10, steps)``; ``deadline_blocks`` (blocks from now) is at
    most the genesis ``max_job_deadline``. The node must stay reachable until a worker has fetched the dataset:
    workers accept a job only after fetching it from the requester.

    Raises:
        JobError: bad parameters or too little balance (checked here before anything is submitted).
    """
    lr_micro = round(lr * 1e6)
    if segment_steps is None:
        segment_steps = min(10, steps)
    if not text:
        raise JobError("the dataset is empty")
    if not (math.isfinite(lr) and lr_micro >= 1):
        raise JobError("lr must be a finite number >= 1e-6")
    await load_torch(node.executor)  # the dataset becomes a tensor below, on the loop
    st = node.ledger.state
    me = node.ident.account
    post = JobPost(node.genesis.domain, me, os.urandom(16), title[:200], node.manifest.model_id,
                   node.blobs.put(dataset_tensors(text)), rank, targets, steps, batch_size, seq_len, lr_micro, seed,
                   segment_steps, price_per_step, st.height + deadline_blocks, sample_ppm, node.ledger.next_nonce(me))
    if st.account(me).balance < post.price:
        raise JobError(f"the job costs {format_amount(post.price)} credits; the balance is "
                       f"{format_amount(st.account(me).balance)}")

    post = post.signed(node.ident)
    try:  # the same checks the ledger will run, so a bad job is refused now with its reason
        apply_tx(st.copy(), post)
    except InvalidTx as e:
        if "nonce" not in str(e):  # a nonce ahead of the ledger is fine: earlier txs are queued
            raise JobError(str(e)) from None
    await node.ledger.submit(post)
    return post


def job_json(job: Job, state: State,
             archived: Callable[[bytes], dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """A job for the API: amounts as base-unit strings with decimals, losses in nats/token (null when NaN).
    ``archived(receipt id)``: the :data:`node.ledger.core.history.SUMMARY_FIELDS` of a segment that left the hot
    state (:meth:`node.ledger.store.LedgerStore.history_entry`), or None; without it such a segment shows only
    its id and status ``archived``."""
    p = job.post

    def amt(x: int) -> dict[str, str]:
        return {"base_units": str(x), "credits": format_amount(x)}

    segments: list[dict[str, Any]] = []
    paid = 0
    for rid in job.segments:
        rec = state.receipts.get(rid)
        if rec is None:  # left the hot state after the job ended (node.ledger.core.history)
            s = archived(rid) if archived is not None else None
            segments.append({"receipt": rid.hex(), "steps": [s["span_start"], s["span_end"]] if s else None,
                             "status": s["status"] if s else "archived", "loss": None,
                             "price": amt(s["price"]) if s else None, "committee": [], "archived": True})
            paid += sum(a for acc, a in (s["payouts"] if s else ()) if acc != p.sender)
            continue
        r = rec.receipt
        segments.append({"receipt": rid.hex(), "steps": [r.step_start, r.step_end], "status": rec.status,
                         "loss": None if r.loss_ppm < 0 else r.loss_ppm / 1e6, "price": amt(r.price),
                         "committee": [account_to_str(m) for m in rec.committee]})
        paid += sum(a for acc, a in rec.payouts if acc != p.sender)
    return {
        "job_id": p.job_id.hex(), "title": p.title, "status": job.status,
        "status_text": STATUS_TEXT[JobStatus(job.status)],
        "requester": account_to_str(p.sender), "worker": account_to_str(job.worker) if job.worker else None,
        "model_id": p.model_id.hex(), "dataset": p.dataset_root.hex(),
        "method": {"type": "lora", "rank": p.rank, "targets": p.targets.split(",")},
        "steps": p.steps, "steps_done": job.next_step, "batch_size": p.batch_size, "seq_len": p.seq_len,
        "lr": p.lr_micro / 1e6, "seed": p.seed, "segment_steps": p.segment_steps, "deadline": p.deadline,
        "sample_ppm": p.sample_ppm, "price_per_step": amt(p.price_per_step), "price": amt(p.price),
        "escrow_left": amt(job.escrow_left), "refunded": amt(job.refunded), "paid": amt(paid),
        "losses": [None if x < 0 else x / 1e6 for x in job.losses], "segments": segments,
        "adapter": job.adapter.hex() or None, "height": job.height, "final_height": job.final_height or None,
        "accepted_height": job.accepted_height or None,
        "start_by": (job.accepted_height + state.params.job_start_window
                     if job.status == ACCEPTED and not job.segments else None),
        "dropped": [{"worker": account_to_str(w), "reason": why, "height": h, "penalty": amt(pen)}
                    for w, why, h, pen in job.dropped],
    }


def _write_adapter(model_dir: Path, post: JobPost, state: list[torch.Tensor], text: bytes,
                   out_dir: Path) -> dict[str, Any]:
    # local: safetensors.torch imports torch (~2 s); this runs on the executor, when a requester fetches an adapter
    from safetensors.torch import save_file

    from ..compute.train import Trainer, encode_text, split_tokens  # local: it imports torch, as above

    spec = spec_of(post)
    trainer = Trainer(model_dir, spec)
    trainer.load_state(state)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(trainer.adapter_weights(), str(out_dir / "adapter_model.safetensors"))
    cfg = trainer.model.peft_config["default"].to_dict()
    cfg["base_model_name_or_path"] = str(model_dir)
    cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in cfg.items()}
    (out_dir / "adapter_config.json").write_text(json.dumps(cfg, indent=2, default=str))
    _, held = split_tokens(encode_text(model_dir, text))
    base = trainer.eval_loss(held, with_adapter=False)
    tuned = trainer.eval_loss(held, with_adapter=True)
    return {"heldout_loss_base": base, "heldout_loss_adapter": tuned,
            "files": [str(out_dir / "adapter_model.safetensors"), str(out_dir / "adapter_config.json")]}


async def fetch_adapter(node: CapabilityNode, job_id: bytes, out_dir: Path) -> dict[str, Any]:
    """Fetch a delivered job's adapter by content hash, write it as a peft adapter under ``out_dir``, and
    measure the held-out loss (last 10 % of the dataset) of the base model and of the base model + adapter.

    Raises:
        JobError: unknown job, not delivered, or the adapter cannot be fetched.
    """
    job = jobs_of(node.ledger.state).get(job_id)
    if job is None:
        raise JobError("no such job")
    if not job.adapter:
        raise JobError(f"job is {job.status}: no adapter has been delivered")
    await load_torch(node.executor)  # fetched tensors are decoded on the loop
    try:
        state = await fetch_blob(node.host, node.blobs, job.adapter, [job.worker])
        text = dataset_bytes(await fetch_blob(node.host, node.blobs, job.post.dataset_root, [job.post.sender]))
    except LookupError as e:
        raise JobError(str(e)) from None
    out = await node.executor.run(_write_adapter, node.cfg.model_dir, job.post, state, text, Path(out_dir))
    return {"adapter": job.adapter.hex(), **out}
