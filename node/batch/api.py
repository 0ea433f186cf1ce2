"""The batch jobs' HTTP router: endpoints under ``/v1/batches`` (issue 14): post an item file, list, status with
progress, agreement rate and payouts, fetch the accepted results, cancel a batch nothing of which is assigned yet.
:func:`node.api.app.create_app` includes it; it builds on :mod:`node.web` (the node dependency, ``ApiError``, the
JSON helpers)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from ..encoding import AMOUNT_FORM, parse_amount
from ..ledger.core.batchstate import Batch, BatchStatus
from ..ledger.core.batchtx import MAX_GENERATE_TOKENS, MAX_REISSUES, MAX_REPLICATION, MAX_WINDOW, BatchCancel
from ..ledger.core.tx import InvalidTx
from ..web.deps import AUTH, CapabilityNode, NodeDep, get_node
from ..web.errors import ApiError
from ..web.models import AmountText
from ..web.views import hex_id
from .client import BatchError, RequesterNode, batch_json, fetch_results, post_batch
from .worker import BatchWorker

# the node of the app a request reached (node.web.deps.get_node), as the batch routes that post and fetch use it
# (node.batch.client.RequesterNode: the capabilities' node and the model's tokenizer; the content store is
# node.service(ContentStore)): create_app's node is a node.api.deps.NodeAPI, which extends RequesterNode
BatchNodeDep = Annotated[RequesterNode, Depends(get_node)]


# A batch job to post (``POST /v1/batches``): its item file and terms.
class BatchRequest(BaseModel):
    items: str = Field(..., max_length=32 << 20,
                       description='the JSONL item file as text, one object per line: {"prompt": str} or '
                                   '{"prompt_ids": [int]} for generate, {"text": str} for score')
    kind: str = Field(..., pattern="^(generate|score)$", description="generate or score")
    replication: int = Field(3, ge=2, le=MAX_REPLICATION, description="workers per item, k")
    quorum: int | None = Field(None, ge=2, le=MAX_REPLICATION,
                               description="equal results that decide an item (default k // 2 + 1; k/2 < q <= k)")
    price: AmountText = Field("0.001", description="decimal credits per item per agreeing worker: " + AMOUNT_FORM)
    max_tokens: int = Field(32, ge=1, le=MAX_GENERATE_TOKENS, description="generate: new tokens per item")
    max_reissues: int = Field(1, ge=0, le=MAX_REISSUES, description="re-issues of an item without a quorum")
    commit_window: int = Field(600, ge=1, le=MAX_WINDOW, description="blocks to commit after an item is drawn")
    reveal_window: int = Field(120, ge=1, le=MAX_WINDOW, description="blocks to reveal after the commit window")


# Options of ``POST /v1/batches/{id}/fetch``.
class BatchFetchRequest(BaseModel):
    include_input: bool = Field(True, description="repeat each item's input line in its result")


router = APIRouter()
"""The ``/v1/batches`` routes; each reads the node of the app it reached (:data:`~node.web.deps.NodeDep`;
:data:`BatchNodeDep` to post and fetch)."""


def _batch(node: CapabilityNode, batch_id: str) -> tuple[bytes, Batch]:
    """``(batch id, batch)`` of ``batch_id`` on the ledger.

    Raises:
        ApiError: 404 ``not_found`` (malformed id or no such batch).
    """
    bid = hex_id(batch_id, 16)
    b: Batch | None = node.ledger.state.tables["batches"].get(bid) if bid is not None else None
    if bid is None or b is None:
        raise ApiError(404, "not_found", "no such batch (ids are 32 hex characters)")
    return bid, b


@router.get("/v1/batches")
async def list_batches(node: NodeDep, status: str | None = None, limit: int = 50, offset: int = 0) -> dict[str, Any]:
    """Batches, newest first, without their items."""
    st = node.ledger.state
    bs = [b for b in sorted(st.tables["batches"].values(), key=lambda b: (-b.height, b.post.id))
          if status is None or b.status.value == status]
    limit = max(1, min(limit, 500))
    return {"total": len(bs), "batches": [batch_json(b, st) for b in bs[max(0, offset):max(0, offset) + limit]]}


@router.get("/v1/batches/{batch_id}")
async def get_batch(node: NodeDep, batch_id: str, items: bool = False) -> dict[str, Any]:
    """One batch: progress (decided / n), agreement rate, payouts and penalties per worker; ``items=true``
    adds every assigned item's workers, commit and reveal counts and accepted result hash."""
    _, b = _batch(node, batch_id)
    out = batch_json(b, node.ledger.state, with_items=items)
    w = node.service(BatchWorker)
    if w is not None:
        out["local_results_computed"] = w.done
    return out


@router.post("/v1/batches", dependencies=AUTH)
async def post(node: BatchNodeDep, req: BatchRequest) -> dict[str, Any]:
    """Check the item file, keep it on this node (workers fetch it from here) and post the batch with escrow.
    A bad file or parameter is refused with its reason (the line number for a file); nothing is posted."""
    try:
        price = parse_amount(req.price)
    except ValueError as e:
        raise ApiError(400, "bad_amount", str(e)) from None
    try:
        p = await post_batch(node, req.items.encode("utf-8"), kind=req.kind, replication=req.replication,
                             quorum=req.quorum, price=price, max_tokens=req.max_tokens,
                             max_reissues=req.max_reissues, commit_window=req.commit_window,
                             reveal_window=req.reveal_window)
    except (BatchError, InvalidTx) as e:
        raise ApiError(400, "bad_batch", str(e)) from None
    return {"batch_id": p.batch_id.hex(), "n_items": p.n_items, "escrow": {"base_units": str(p.escrow())},
            "status": "submitted"}


@router.post("/v1/batches/{batch_id}/fetch", dependencies=AUTH)
async def fetch(node: BatchNodeDep, batch_id: str, req: BatchFetchRequest | None = None) -> dict[str, Any]:
    """The accepted results, each fetched by hash from the workers that agreed on it (and kept here)."""
    bid, b = _batch(node, batch_id)
    try:
        rows = await fetch_results(node, bid)
    except BatchError as e:
        raise ApiError(503, "results_unavailable", str(e)) from None
    if req is not None and not req.include_input:
        for row in rows:
            row.pop("input", None)
    return {"batch_id": batch_id, "status": b.status.value, "n_items": b.post.n_items, "results": rows}


@router.post("/v1/batches/{batch_id}/cancel", dependencies=AUTH)
async def cancel(node: NodeDep, batch_id: str) -> dict[str, Any]:
    bid, b = _batch(node, batch_id)
    me = node.ident.account
    if b.post.sender != me:
        raise ApiError(403, "not_yours", "only the requester can cancel a batch")
    if b.status != BatchStatus.OPEN:
        raise ApiError(409, "not_open", f"only a batch with no item assigned can be cancelled; this one is "
                                        f"{b.status.value}")
    await node.ledger.submit(BatchCancel(node.genesis.domain, me, bid, node.ledger.next_nonce(me))
                             .signed(node.ident))
    return {"batch_id": batch_id, "status": "cancel submitted"}

