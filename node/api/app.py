"""The local wallet/credits HTTP API (FastAPI; OpenAPI at ``/docs`` and ``/openapi.json``).

Served by hypercorn's trio worker on the node's own event loop, so handlers await node services directly.
Binds to 127.0.0.1 by default. Every request must carry a loopback ``Host`` and, if it has an ``Origin``, a
loopback one (DNS rebinding and cross-site requests are refused); every state-changing request needs the node's
API token (``Authorization: Bearer <data_dir/api_token>``). Amounts are strings of base units with a decimal
display beside them; errors are JSON ``{"code", "message"}``.
"""

from __future__ import annotations

import hmac
import re
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..encoding import format_amount, parse_amount
from ..identity import account_from_str, account_to_str
from ..ledger.tx import VERDICT_NAMES, InvalidTx, Transfer

LOOPBACK_HOST = re.compile(r"^(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|\[::1\])(:\d{1,5})?$")
LOOPBACK_ORIGIN = re.compile(r"^https?://(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|\[::1\])(:\d{1,5})?$")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        self.status, self.code, self.message = status, code, message


def amount(units: int) -> dict:
    return {"base_units": str(units), "credits": format_amount(units)}


def _hex(b: Any) -> Any:
    return b.hex() if isinstance(b, bytes) else b


def _parse_id(text: str, what: str) -> bytes:
    try:
        b = bytes.fromhex(text)
    except ValueError:
        b = b""
    if len(b) != 32:
        raise ApiError(400, "bad_id", f"{what} must be 64 hex characters")
    return b


def _parse_account(text: str) -> bytes:
    try:
        return account_from_str(text)
    except ValueError as e:
        raise ApiError(400, "bad_account", str(e)) from None


def receipt_json(rec: dict) -> dict:
    f = rec["receipt"]["f"]
    (sid, worker, requester, model_id, start, end, tokens, in_root, out_root, price, opened, comp) = f
    return {
        "id": rec["id"].hex(), "status": rec["status"], "height": rec["height"],
        "session_id": sid.hex(), "worker": account_to_str(worker), "requester": account_to_str(requester),
        "model_id": model_id.hex(), "span": [start, end], "tokens": tokens, "work": tokens * (end - start),
        "inputs_root": in_root.hex(), "outputs_root": out_root.hex(), "price": amount(price),
        "opened_height": opened, "compression": comp, "sampling_probability_ppm": rec["p_ppm"],
        "round": rec["round"], "committee": [account_to_str(m) for m in rec["committee"]],
        "votes": [{"voter": account_to_str(v), "round": r, "verdict": VERDICT_NAMES[verdict],
                   "distance_ppm": d} for v, r, verdict, d in rec["votes"]],
        "final_height": rec["final_height"] or None,
        "payouts": [{"account": account_to_str(a) if a != _treasury() else "treasury", "amount": amount(x)}
                    for a, x in rec["payouts"]],
        "slashed": amount(rec["slashed"]),
    }


def _proof_json(proof: dict, commit) -> dict:
    """Proof with bytes as hex; ``commit`` as ``[validator hex, round, signature hex]`` entries."""
    return {"header": [_hex(x) for x in proof["header"]], "leaf": proof["leaf"].hex(), "index": proof["index"],
            "size": proof["size"], "path": [p.hex() for p in proof["path"]],
            "commit": [[v.hex(), r, s.hex()] for v, r, s in commit]}


def proof_from_json(d: dict) -> tuple[dict, list]:
    """Inverse of the API's proof JSON: ``(proof, commit)`` with bytes, for the light-client verifiers."""
    h = d["header"]
    header = [h[0], h[1], bytes.fromhex(h[2]), h[3], bytes.fromhex(h[4]), bytes.fromhex(h[5]), bytes.fromhex(h[6])]
    proof = {"header": header, "leaf": bytes.fromhex(d["leaf"]), "index": d["index"], "size": d["size"],
             "path": [bytes.fromhex(p) for p in d["path"]]}
    return proof, [(bytes.fromhex(v), r, bytes.fromhex(s)) for v, r, s in d["commit"]]


def _treasury() -> bytes:
    from ..ledger.genesis import TREASURY

    return TREASURY


class GenerateRequest(BaseModel):
    prompt: str | None = Field(None, max_length=100_000, description="text, tokenized by the model's tokenizer")
    prompt_ids: list[int] | None = Field(None, max_length=100_000, description="token ids instead of text")
    max_new_tokens: int = Field(32, ge=1, le=4096)


class TransferRequest(BaseModel):
    to: str = Field(..., max_length=128, description="recipient peer ID")
    amount: str = Field(..., max_length=64, description="decimal credits, e.g. \"1.5\"")


def create_app(node) -> FastAPI:
    """The API for ``node`` (a :class:`~node.runtime.Node`)."""
    app = FastAPI(title="Tally node API", version="1", description=__doc__)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse({"code": exc.code, "message": exc.message}, status_code=exc.status)

    @app.middleware("http")
    async def _loopback_only(request: Request, call_next):
        host = request.headers.get("host", "")
        origin = request.headers.get("origin")
        if not LOOPBACK_HOST.match(host):
            return JSONResponse({"code": "forbidden_host", "message": "Host must be a loopback name"}, 403)
        if origin is not None and not LOOPBACK_ORIGIN.match(origin):
            return JSONResponse({"code": "forbidden_origin", "message": "cross-origin requests are refused"}, 403)
        return await call_next(request)

    def require_token(request: Request) -> None:
        auth = request.headers.get("authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), node.api_token.encode()):
            raise ApiError(401, "unauthorized", "missing or wrong API token (see <data-dir>/api_token)")

    @app.get("/v1/status")
    async def status() -> dict:
        st = node.ledger.state
        return {
            "chain_id": st.chain_id, "height": st.height, "head_hash": st.last_hash.hex(),
            "peer_id": node.ident.peer_id, "addrs": node.host.addrs, "validator": node.ledger.is_validator,
            "peers": node.host.connected_peers(), "mempool": len(node.ledger.mempool),
            "model_id": node.manifest.model_id.hex(), "num_blocks": node.manifest.num_blocks,
            "span": list(node.cfg.span) if node.cfg.span else None,
            "swarm": [{"peer": p, "span": [s, e]} for p, s, e in node.swarm.live(node.manifest.model_id)],
            "supply": amount(st.supply()),
        }

    @app.get("/v1/accounts/{account}")
    async def account(account: str) -> dict:
        a = _parse_account(account)
        acc = node.ledger.state.account(a)
        return {"account": account_to_str(a), "balance": amount(acc.balance), "bond": amount(acc.bond),
                "escrow": amount(acc.escrow), "nonce": acc.nonce, "valid_run": acc.valid_run,
                "slashed": amount(acc.slashed), "height": node.ledger.state.height}

    @app.get("/v1/blocks/{height}")
    async def block(height: int) -> dict:
        raw = node.store.get_block_raw(height) if height >= 1 else None
        if raw is None:
            raise ApiError(404, "not_found", f"no block at height {height}")
        chain, h, prev, t, proposer, troot, sroot = raw["b"]["h"]
        from ..encoding import H, pack
        from ..ledger.block import Header

        header = Header(chain, h, prev, t, proposer, troot, sroot)
        return {"height": h, "hash": header.hash.hex(), "prev_hash": prev.hex(), "time_ms": t,
                "proposer": account_to_str(proposer), "tx_root": troot.hex(), "state_root": sroot.hex(),
                "txs": [{"kind": tx["t"], "id": H(pack(tx)).hex()} for tx in raw["b"]["txs"]],
                "commit": [{"validator": account_to_str(v), "round": r, "signature": s.hex()} for v, r, s in raw["c"]]}

    @app.get("/v1/receipts/{receipt_id}")
    async def receipt(receipt_id: str) -> dict:
        rid = _parse_id(receipt_id, "receipt id")
        rec = node.ledger.state.receipts.get(rid)
        if rec is None:
            raise ApiError(404, "not_found", "no such receipt on the ledger")
        return receipt_json(rec.to_dict())

    @app.get("/v1/proofs/receipts/{receipt_id}")
    async def receipt_proof(receipt_id: str) -> dict:
        """Inclusion proof of a receipt transaction in its block, with that block's commit (light client:
        :func:`node.ledger.proofs.verify_header` then :func:`node.ledger.proofs.verify_tx_proof`)."""
        from ..ledger.proofs import tx_proof

        rid = _parse_id(receipt_id, "receipt id")
        rec = node.ledger.state.receipts.get(rid)
        if rec is None:
            raise ApiError(404, "not_found", "no such receipt on the ledger")
        block, commit = node.store.get_block(rec.height)
        return _proof_json(tx_proof(block, rid), commit)

    @app.get("/v1/proofs/accounts/{account}")
    async def account_proof(account: str) -> dict:
        """Proof of an account's state under the head header's state root (the state after the parent block)."""
        from ..ledger.proofs import account_proof as make

        a = _parse_account(account)
        got = node.store.get_block(node.store.head) if node.store.head else None
        if got is None or a not in node.ledger.parent_state.accounts:
            raise ApiError(404, "not_found", "no block yet, or no such account in the committed state")
        block, commit = got
        return _proof_json(make(node.ledger.parent_state, block.header, a), commit)

    @app.post("/v1/generate", dependencies=[Depends(require_token)])
    async def generate(req: GenerateRequest) -> dict:
        from ..compute.shards import NoRouteError
        from ..inference.client import PromptTooLong

        if (req.prompt is None) == (req.prompt_ids is None):
            raise ApiError(400, "bad_request", "give exactly one of prompt or prompt_ids")
        try:
            ids = node.encode_prompt(req.prompt) if req.prompt is not None else list(req.prompt_ids)
            if any(not 0 <= i < node.manifest.vocab_size for i in ids):
                raise ApiError(400, "bad_request", "token id out of the vocabulary")
            gen = await node.generate(ids, req.max_new_tokens)
        except PromptTooLong as e:
            raise ApiError(413, "prompt_too_long", str(e)) from None
        except NoRouteError as e:
            raise ApiError(503, "no_route", str(e)) from None
        except ValueError as e:
            raise ApiError(400, "bad_request", str(e)) from None
        return {"prompt_ids": gen.prompt_ids, "tokens": gen.tokens, "text": node.decode(gen.tokens),
                "route": [{"peer": p, "span": [s, e]} for p, s, e in gen.route],
                "receipts": [r.id.hex() for r in gen.receipts], "seconds": gen.seconds}

    @app.post("/v1/transfer", dependencies=[Depends(require_token)])
    async def transfer(req: TransferRequest) -> dict:
        to = _parse_account(req.to)
        try:
            units = parse_amount(req.amount)
        except ValueError as e:
            raise ApiError(400, "bad_amount", str(e)) from None
        me = node.ident.account
        pending = sum(1 for t in node.ledger.mempool.values() if isinstance(t, Transfer) and t.sender == me)
        tx = Transfer(node.genesis.chain_id, me, to, units, node.ledger.state.account(me).nonce + pending)
        try:
            tid = await node.ledger.submit(tx.signed(node.ident))
        except InvalidTx as e:
            raise ApiError(400, "invalid_tx", str(e)) from None
        return {"id": tid.hex(), "amount": amount(units)}

    return app
