"""``/v1``: the wallet/credits JSON API (reads for anyone on loopback; state changes with the API token).

Every route answers JSON shaped like its model in :mod:`node.api.models` (:mod:`node.api.postmodels` for the
state-changing ones); errors are ``{"code", "message"}``
with 400 (bad input), 401 (``unauthorized``: missing or wrong token), 403 (foreign ``Host``/``Origin``), 404
(``not_found``), 413 (``prompt_too_long``), 422 (``bad_request``: body or parameters do not match the schema),
502 (``route_failed``) or 503 (``no_route``). A state-changing request is checked in full — token, input, and a
dry run of the transaction on a copy of the ledger state with this node's pending transactions — before
anything is signed or queued, so a refused request changes nothing.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import trio
from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from ..compute.compare import to_ppm
from ..compute.shards import NoRouteError
from ..encoding import pack, parse_amount
from ..inference.client import Generation, HopFailed, PromptTooLong
from ..inference.redundant import RedundantGeneration
from ..ledger import proofs
from ..ledger.core.history import HistoryMissing
from ..ledger.core.state import apply_tx
from ..ledger.core.tx import Bond, InvalidTx, Transfer, Unbond
from ..ledger.core.txbase import Tx
from ..ledger.core.valset import ValidatorJoin, ValidatorLeave
from ..ledger.genesis import TREASURY
from ..ledger.txstatus import TxState, TxStatus
from ..models.lookup import UnknownModel
from ..web.deps import AUTH
from ..web.errors import ApiError
from ..web.models import ErrorOut
from ..web.views import Json, amount, parse_account, parse_id
from . import models as m, postmodels as pm, views as v
from .deps import NodeAPI, NodeAPIDep
from .queries import QueriesDep

E: dict[int | str, dict[str, Any]] = {c: {"model": ErrorOut} for c in (400, 403, 404, 422)}
E_POST: dict[int | str, dict[str, Any]] = {**E, 401: {"model": ErrorOut}}


class JSON(JSONResponse):
    """Compact JSON without a second validation pass (the models document the shape; tests check it)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()


def _next_nonce(node: NodeAPI, me: bytes) -> int:
    return node.ledger.next_nonce(me)  # the ledger nonce plus this account's ready queued transactions


def dry_run(node: NodeAPI, tx: Tx) -> None:
    """Apply this node's pending transactions and then ``tx`` to a copy of the ledger state.

    Raises:
        ApiError: 400 ``invalid_tx`` with the reason the ledger would refuse ``tx``.
    """
    w = node.ledger.state.copy()
    me = node.ident.account
    nonced = [(sn[1], t) for t in node.ledger.mempool.values() if (sn := t.sender_nonce) is not None and sn[0] == me]
    mine = [t for _n, t in sorted(nonced, key=lambda x: x[0])]
    for t in mine:
        with contextlib.suppress(InvalidTx):  # one the ledger would refuse is skipped, as a block would
            apply_tx(w, t)
    try:
        apply_tx(w, tx)
    except InvalidTx as e:
        raise ApiError(400, "invalid_tx", str(e)) from None


def tx_status_json(tid: bytes, st: TxStatus) -> Json:
    """The ``TxStatusOut`` of transaction ``tid`` with status ``st``."""
    pending = st.state is TxState.PENDING
    return {"id": tid.hex(), "status": st.state.value, "reason": st.reason, "summary": st.describe(),
            "height": st.height if st.state is TxState.INCLUDED else None,
            "pending_s": round(st.pending_s, 3) if pending else None,
            "missing_nonce": st.missing_nonce, "expires_in_blocks": st.expires_in_blocks, "resent": st.resent}


def _amount(text: str) -> int:
    try:
        return parse_amount(text)
    except ValueError as e:
        raise ApiError(400, "bad_amount", str(e)) from None


router = APIRouter(prefix="/v1", default_response_class=JSON, responses=E)
"""The ``/v1`` wallet, explorer-data and proof routes; each reads the node of the app it reached (:data:`NodeAPIDep`)
through its views (:data:`QueriesDep`)."""


# FastAPI mutates parameter objects: each route gets fresh ones
def Account() -> Any:
    """A fresh ``{account}`` path parameter: a peer ID or 64 hex characters."""
    return Path(..., max_length=128, pattern=m.ACCOUNT_RE,
                description="peer ID (12D3KooW...) or 64 hex characters")


def Id() -> Any:
    """A fresh 64-hex-character id path parameter."""
    return Path(..., max_length=64, pattern="^[0-9a-fA-F]{64}$", description="64 hex characters")


def Limit() -> Any:
    """A fresh ``limit`` query parameter (page size, 1 to 200, default 50)."""
    return Query(50, ge=1, le=200, description="page size")


def Cursor() -> Any:
    """A fresh ``cursor`` query parameter (the ``next`` of the previous page)."""
    return Query(None, max_length=128, pattern="^[0-9a-f]*$", description="`next` of the previous page")


@router.get("/status", response_model=m.StatusOut, summary="Node, chain head and swarm")
async def status(queries: QueriesDep) -> JSON:
    return JSON(queries.status())


@router.get("/accounts/{account}", response_model=m.AccountOut, summary="Balance, bond and escrow of an account")
async def account(queries: QueriesDep, account: str = Account()) -> JSON:
    return JSON(queries.account(parse_account(account)))


@router.get("/accounts/{account}/history", response_model=m.HistoryOut, summary="History of an account, newest first")
async def history(queries: QueriesDep, account: str = Account(), limit: int = Limit(),
                  cursor: str | None = Cursor()) -> JSON:
    return JSON(queries.history(parse_account(account), limit, cursor))


@router.get("/accounts/{account}/receipts", response_model=m.AccountReceiptsOut,
            summary="Receipts naming an account (worker, requester, committee) with their verdicts")
async def account_receipts(queries: QueriesDep, account: str = Account(), limit: int = Limit(),
                           cursor: str | None = Cursor()) -> JSON:
    return JSON(queries.account_receipts(parse_account(account), limit, cursor))


@router.get("/bonds", response_model=m.BondsOut, summary="Bonded accounts (workers, committee members, validators)")
async def bonds(queries: QueriesDep) -> JSON:
    return JSON(queries.bonds())


@router.get("/blocks", response_model=m.BlocksOut, summary="Blocks, newest first")
async def blocks(queries: QueriesDep, limit: int = Query(20, ge=1, le=200),
                 before: int | None = Query(None, ge=1, le=2**62)) -> JSON:
    return JSON(queries.blocks(limit, before))


@router.get("/blocks/{height}", response_model=m.BlockOut, summary="A block with its transactions and commit")
async def block(queries: QueriesDep, height: int = Path(..., ge=1, le=2**62)) -> JSON:
    return JSON(queries.block(height))


@router.get("/txs/{tx_id}", response_model=m.TxOut, summary="A transaction in a stored block")
async def tx(queries: QueriesDep, node: NodeAPIDep, tx_id: str = Id()) -> JSON:
    """404 while it is in no stored block: code ``pending`` (queued here; the message says for how long and
    why, e.g. which nonce is missing), ``dropped`` (with the reason) or ``not_found``; ``/v1/txs/{id}/status``
    answers the same as fields."""
    tid = parse_id(tx_id, "transaction id")
    try:
        return JSON(queries.tx(tid))
    except ApiError as e:
        if e.status != 404 or node.store.tx_location(tid) is not None:
            raise  # pruned, or another error
        st = node.ledger.tx_status(tid)
        if st.state is TxState.PENDING:
            raise ApiError(404, "pending", f"not in a block yet; {st.describe()}") from None
        if st.state is TxState.DROPPED:
            raise ApiError(404, "dropped", f"in no block: {st.describe()}") from None
        raise


@router.get("/txs/{tx_id}/status", response_model=m.TxStatusOut,
            summary="Where a transaction stands on this node: included, pending (why) or dropped (why)")
async def tx_status(node: NodeAPIDep, tx_id: str = Id()) -> JSON:
    tid = parse_id(tx_id, "transaction id")
    return JSON(tx_status_json(tid, node.ledger.tx_status(tid)))


@router.get("/receipts", response_model=m.ReceiptsOut, summary="Receipts, newest first")
async def receipts(queries: QueriesDep, limit: int = Limit(), cursor: str | None = Cursor(),
                   status: str | None = Query(
                       None, pattern="^(pending|sampled|valid|invalid|settled|unverified)$")) -> JSON:
    return JSON(queries.receipts(limit, cursor, status))


@router.get("/receipts/{receipt_id}", response_model=m.ReceiptOut,
                 summary="A receipt, its committee, votes and verdict")
async def receipt(queries: QueriesDep, receipt_id: str = Id()) -> JSON:
    return JSON(queries.receipt(parse_id(receipt_id, "receipt id")))


@router.get("/validators", response_model=m.ValidatorsOut, summary="The validator set and its recent activity")
async def validators(queries: QueriesDep, window: int = Query(100, ge=1, le=1000)) -> JSON:
    return JSON(queries.validators(window))


@router.get("/swarm", response_model=m.SwarmOut, summary="Live servers and which decoder blocks they hold")
async def swarm(queries: QueriesDep) -> JSON:
    return JSON(queries.swarm())


@router.get("/verification", response_model=m.VerificationOut, summary="Sampling, verdicts and slashes over time")
async def verification(queries: QueriesDep, buckets: int = Query(24, ge=1, le=200)) -> JSON:
    return JSON(queries.verification(buckets))


@router.get("/search", response_model=m.SearchOut, summary="Resolve a height, hash, id or account")
async def search(queries: QueriesDep, q_: str = Query(..., alias="q", min_length=1, max_length=128)) -> JSON:
    return JSON(queries.search(q_))


@router.get("/light/{height}", summary="What a light client needs of a height: header, commit, signing validator set")
async def light(node: NodeAPIDep, height: int = Path(..., ge=1, le=2**62)) -> JSON:
    """``{"height", "light_block": hex of msgpack {"header", "commit", "validators"}}``: verify with
    :class:`node.ledger.proofs.LightClient` (:func:`~node.ledger.proofs.parse_light_block` reads it), which
    checks the set against the previous header's ``next_validators_hash``."""
    try:
        lb = proofs.light_block(node.store, height)
    except KeyError as e:
        raise ApiError(404, "not_found", str(e).strip("'\"")) from None
    return JSON({"height": height, "light_block": pack(lb).hex()})


@router.get("/proofs/receipts/{receipt_id}", response_model=m.ProofOut,
            summary="Inclusion proof of a receipt in its block, with the block's commit")
async def receipt_proof(node: NodeAPIDep, receipt_id: str = Id()) -> JSON:
    """Light client: :func:`node.ledger.proofs.verify_header`, then :func:`~node.ledger.proofs.verify_tx_proof`."""
    rid = parse_id(receipt_id, "receipt id")
    rec = node.ledger.state.receipts.get(rid)
    if rec is None:
        raise ApiError(404, "not_found", "no such receipt on the ledger")
    got = node.store.get_block(rec.height)
    if got is None:
        raise ApiError(404, "not_found", f"the body of block {rec.height} is pruned on this node (it keeps "
                                         f"bodies from height {node.store.pruned_below}); ask a full node")
    block, commit = got
    return JSON(v.proof_json(proofs.tx_proof(block, rid), commit))


@router.get("/proofs/accounts/{account}", response_model=m.ProofOut,
            summary="Proof of an account's state under the head header's state root")
async def account_proof(node: NodeAPIDep, account: str = Account()) -> JSON:
    """The state after the parent of the head block (the state the head header commits to)."""
    a = parse_account(account)
    got = node.store.get_block(node.store.head) if node.store.head else None
    if got is None or a not in node.ledger.parent_state.accounts:
        raise ApiError(404, "not_found", "no block yet, or no such account in the committed state")
    block, commit = got
    return JSON(v.proof_json(proofs.account_proof(node.ledger.parent_state, block.header, a), commit))


@router.get("/proofs/records/{receipt_id}", response_model=m.ProofOut,
            summary="Proof of a receipt's ledger record (status, votes, payouts) under the head header's state root")
async def record_proof(node: NodeAPIDep, receipt_id: str = Id()) -> JSON:
    """The record in the state after the parent of the head block (the state the head header commits to)."""
    rid = parse_id(receipt_id, "receipt id")
    got = node.store.get_block(node.store.head) if node.store.head else None
    if got is None or rid not in node.ledger.parent_state.receipts:
        raise ApiError(404, "not_found", "no block yet, or no such receipt in the committed state")
    block, commit = got
    return JSON(v.proof_json(proofs.entry_proof(node.ledger.parent_state, block.header, "receipts", rid), commit))


@router.get("/proofs/history/{receipt_id}", response_model=m.HistoryProofOut,
            summary="Proof of a receipt that left the hot state: its summary in the history log, the log's RFC 9162 "
                    "audit path, and the log head under the head header's state root")
async def history_proof(node: NodeAPIDep, receipt_id: str = Id()) -> JSON:
    """Light client: :func:`node.ledger.proofs.verify_header`, then
    :func:`~node.ledger.proofs.verify_history_proof`."""
    rid = parse_id(receipt_id, "receipt id")
    archived = node.store.history_entry(rid)
    if archived is None:
        where = ("it is still in the hot state: use /v1/proofs/records/" + receipt_id
                 if rid in node.ledger.state.receipts else "no such receipt in this node's history")
        raise ApiError(404, "not_found", f"receipt not archived: {where}")
    index, left, data = archived
    got = node.store.get_block(node.store.head) if node.store.head else None
    if got is None:
        raise ApiError(404, "not_found", "no block yet")
    block, commit = got
    try:
        proof = proofs.history_proof(node.ledger.parent_state, block.header, node.store, rid, index, data)
    except KeyError:
        raise ApiError(404, "not_found", f"archived at height {left}, in the head block: the next header "
                       "commits to it; ask again after the next block") from None
    except HistoryMissing as e:
        raise ApiError(404, "not_found", str(e)) from None
    return JSON(v.history_proof_json(proof, commit, left))


async def _submit(node: NodeAPI, tx: Transfer | Bond | Unbond, kind: str) -> JSON:
    signed = tx.signed(node.ident)
    dry_run(node, signed)
    try:
        tid = await node.ledger.submit(signed)
    except InvalidTx as e:
        raise ApiError(400, "invalid_tx", str(e)) from None
    return JSON({"id": tid.hex(), "kind": kind, "amount": amount(tx.amount), "nonce": tx.nonce})


@router.post("/transfer", dependencies=AUTH, response_model=pm.SubmittedOut, responses=E_POST,
             summary="Send credits from this node's account (needs the API token)")
async def transfer(node: NodeAPIDep, req: pm.TransferRequest) -> JSON:
    to = parse_account(req.to)
    if to == TREASURY:
        raise ApiError(400, "bad_account", "the treasury cannot receive transfers")
    me = node.ident.account
    tx = Transfer(node.genesis.domain, me, to, _amount(req.amount), _next_nonce(node, me))
    return await _submit(node, tx, "transfer")


@router.post("/bond", dependencies=AUTH, response_model=pm.SubmittedOut, responses=E_POST,
             summary="Lock part of this node's balance as its worker bond (needs the API token)")
async def bond(node: NodeAPIDep, req: pm.BondRequest) -> JSON:
    me = node.ident.account
    return await _submit(node, Bond(node.genesis.domain, me, _amount(req.amount), _next_nonce(node, me)), "bond")


@router.post("/unbond", dependencies=AUTH, response_model=pm.SubmittedOut, responses=E_POST,
             summary="Release bond back to the balance once no receipt of this node is pending (needs the token)")
async def unbond(node: NodeAPIDep, req: pm.BondRequest) -> JSON:
    me = node.ident.account
    return await _submit(node, Unbond(node.genesis.domain, me, _amount(req.amount), _next_nonce(node, me)), "unbond")


@router.post("/validator", dependencies=AUTH, response_model=pm.SubmittedOut, responses=E_POST,
             summary="Join the validator set (bonded with at least min_validator_bond) or leave it; effective two "
                     "heights after the block that includes it (needs the API token)")
async def validator(node: NodeAPIDep, req: pm.ValidatorTxRequest) -> JSON:
    kinds = {"join": ValidatorJoin, "leave": ValidatorLeave}
    if req.action not in kinds:
        raise ApiError(400, "bad_request", "action is join or leave")
    me = node.ident.account
    nonce = _next_nonce(node, me)
    tx = kinds[req.action](node.genesis.domain, me, nonce).signed(node.ident)
    dry_run(node, tx)
    try:
        tid = await node.ledger.submit(tx)
    except InvalidTx as e:
        raise ApiError(400, "invalid_tx", str(e)) from None
    return JSON({"id": tid.hex(), "kind": tx.KIND, "amount": amount(0), "nonce": nonce})


def redundancy_view(gen: Generation) -> Json:
    """The redundancy fields of a generate reply (node.inference.redundant)."""
    if not isinstance(gen, RedundantGeneration) or gen.redundancy != 2:
        return {"redundancy": 1}

    def hops(route: list[tuple[str, int, int]]) -> list[Json]:
        return [{"peer": p, "span": [s, e]} for p, s, e in route]

    mm = gen.mismatch
    return {"redundancy": 2, "routes": [hops(rt) for rt in gen.routes], "mismatch": None if mm is None else {
        "step": mm.token, "span": list(mm.span), "hops_a": hops(mm.hops_a), "hops_b": hops(mm.hops_b),
        "distance_ppm": to_ppm(mm.distance), "tolerance_ppm": to_ppm(mm.tolerance),
        "next_tokens": list(mm.next_tokens) if mm.next_tokens else None,
        "disputed": [x.hex() for x in mm.disputed], "finish": hops(mm.finish)}}


@router.post("/generate", dependencies=AUTH, response_model=pm.GenerateOut,
             responses={**E_POST, **{c: {"model": ErrorOut} for c in (404, 413, 502, 503)}},
             summary="Generate greedily through the swarm, paying for each span (needs the API token)")
async def generate(node: NodeAPIDep, req: pm.GenerateRequest) -> JSON:
    if sum(x is not None for x in (req.prompt, req.prompt_ids, req.messages)) != 1:
        raise ApiError(400, "bad_request", "give exactly one of prompt, prompt_ids or messages")
    try:
        client = await trio.to_thread.run_sync(node.client_for, req.model)  # reads manifests from disk
    except UnknownModel as e:
        raise ApiError(404, "unknown_model", str(e)) from None
    try:
        # off the event loop: the first prompt loads the tokenizer and the client head (seconds)
        if req.prompt is not None:
            ids = await trio.to_thread.run_sync(node.encode_prompt, req.prompt, req.model)
        elif req.messages is not None:
            chat = [{"role": msg.role, "content": msg.content} for msg in req.messages]
            ids = await trio.to_thread.run_sync(node.encode_chat, chat, req.model)
        else:
            ids = list(req.prompt_ids or ())
        if not ids:
            raise ApiError(400, "bad_request", "the prompt is empty")
        if any(not 0 <= i < client.manifest.vocab_size for i in ids):
            raise ApiError(400, "bad_request", "token id out of the vocabulary")
        gen = await node.generate(ids, req.max_new_tokens, model=req.model, redundancy=req.redundancy)
    except PromptTooLong as e:
        raise ApiError(413, "prompt_too_long", str(e)) from None
    except NoRouteError as e:
        raise ApiError(503, "no_route", str(e)) from None
    except HopFailed as e:
        raise ApiError(502, "route_failed", str(e)) from None
    except ValueError as e:
        raise ApiError(400, "bad_request", str(e)) from None
    return JSON({"prompt_ids": gen.prompt_ids, "tokens": gen.tokens, "text": node.decode(gen.tokens, req.model),
                 "route": [{"peer": p, "span": [s, e], **route_path(node, p)} for p, s, e in gen.route],
                 "receipts": [x.id.hex() for x in gen.receipts], "seconds": gen.seconds,
                 "first_token_s": gen.first_token_s, **redundancy_view(gen)})


def route_path(node: NodeAPI, peer: str) -> dict[str, Any]:
    """How ``node`` reaches a route's server now: ``path`` (direct or relayed) and ``rtt_ms`` (issue 25)."""
    net = node.net
    return net.path_of(peer) if net is not None else {}
