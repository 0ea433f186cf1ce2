"""JSON views of ledger objects (plain dicts shaped like :mod:`node.api.models`), shared by the API and pages.

Amounts become ``{"base_units": str, "credits": str}``, accounts peer IDs (the treasury is ``"treasury"``), other
bytes lower-case hex (the helpers, and parsing ids and accounts from a path, are :mod:`node.web.views`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields as dc_fields
from typing import Any

from ..encoding import unpack
from ..ledger.core.block import Block
from ..ledger.core.history import SUMMARY_FIELDS
from ..ledger.core.jobstate import STATUS_TEXT, Job
from ..ledger.core.rows import Account, ReceiptRecord
from ..ledger.core.tx import VERDICT_NAMES
from ..ledger.core.txbase import Tx
from ..ledger.genesis import TREASURY
from ..web.views import Json, acct, amount, hexid
from .receiptview import receipt_view

ACCOUNT_FIELDS = {"sender", "recipient", "worker", "requester", "voter", "validator"}
AMOUNT_FIELDS = {"amount", "price", "price_per_step"}
RECEIPT_MAIN = {"session_id", "job_id", "worker", "requester", "model_id", "span_start", "span_end", "tokens",
                "price", "opened_height"}
_STATUS_TEXT: dict[str, str] = {k.value: text for k, text in STATUS_TEXT.items()}  # by a Job's status string
Commit = Iterable[Sequence[Any]]  # (validator, round, signature) entries: tuples in a Block, lists from msgpack


def value(name: str, v: Any) -> Any:
    """One transaction field as JSON."""
    if isinstance(v, bytes):
        return acct(v) if name in ACCOUNT_FIELDS and len(v) == 32 else v.hex()
    if name in AMOUNT_FIELDS and isinstance(v, int):
        return amount(v)
    if isinstance(v, (list, tuple)):
        return [value(name, x) for x in v]
    return v


def tx_fields(tx: Tx, skip: frozenset[str] | set[str] = frozenset()) -> Json:
    """Every unsigned field of a transaction object (chain id and signatures left out): a generic dump over the
    kind's declared dataclass fields, by name (the fields a view names are read typed, :mod:`node.api.receiptview`)."""
    return {f.name: value(f.name, getattr(tx, f.name)) for f in dc_fields(tx)
            if f.name not in tx.SIGS and f.name != "chain_id" and f.name not in skip}


def receipt_json(rec: ReceiptRecord) -> Json:
    """A :class:`~node.ledger.core.state.ReceiptRecord` (inference or training receipt) with its verification."""
    r = rec.receipt
    rv = receipt_view(r)  # raises TypeError for a kind it does not know
    s = rv.session  # an inference receipt's session, None for a training receipt
    return {
        "id": rv.id.hex(), "kind": rv.kind, "status": rec.status,
        "height": rec.height, "session_id": s.session_id.hex() if s is not None else None,
        "job_id": hexid(rv.job_id), "worker": acct(rv.worker), "requester": acct(rv.requester),
        "model_id": s.model_id.hex() if s is not None else None,
        "span": [s.span_start, s.span_end] if s is not None else None,
        "tokens": s.tokens if s is not None else None, "work": s.work if s is not None else None,
        "price": amount(rv.price), "opened_height": s.opened_height if s is not None else None,
        "sampling_probability_ppm": rec.p_ppm, "round": rec.round, "committee": [acct(m) for m in rec.committee],
        "votes": [{"voter": acct(v), "round": rd, "verdict": VERDICT_NAMES.get(verdict, str(verdict)),
                   "distance_ppm": d} for v, rd, verdict, d in rec.votes],
        "final_height": rec.final_height or None,
        "payouts": [{"account": acct(a), "amount": amount(x)} for a, x in rec.payouts],
        "slashed": amount(rec.slashed),
        "fields": tx_fields(r, RECEIPT_MAIN),
    }


def account_json(acc: Account, a: bytes, height: int, min_bond: int) -> Json:
    """Account ``a`` (state ``acc`` at ``height``): amounts, nonce, valid run, and whether it may work."""
    return {"account": acct(a), "balance": amount(acc.balance), "bond": amount(acc.bond),
            "escrow": amount(acc.escrow), "slashed": amount(acc.slashed), "nonce": acc.nonce,
            "valid_run": acc.valid_run, "eligible": acc.bond >= min_bond and a != TREASURY, "height": height}


_EFFECT = {  # (kind, role) -> what the event did to the account; role None: any
    ("receipt", "requester"): "receipt included: its price moved from balance into escrow until the verdict",
    ("receipt", "worker"): "receipt included: paid to the worker when final",
    ("paid", None): "escrow released for a final receipt (paid out, or refunded when invalid)",
    ("payout", None): "credited for a final receipt (worker or committee share)",
    ("refund", None): "escrow returned to the balance",
    ("slash", None): "bond slashed",
}


def event_json(height: int, seq: int, ev: dict[str, Any]) -> Json:
    """One history event from the store's index (see :func:`node.ledger.explorer_index.index_block`). ``effect`` says in
    words what it did to the account: a receipt's price appears twice for its requester, once when the receipt
    is included (moved into escrow) and once as ``paid`` when it is final (the escrow released); it is spent
    once."""
    amt = ev.get("amount")
    kind, role = ev.get("k", "?"), ev.get("role")
    return {"height": height, "seq": seq, "kind": kind, "role": role,
            "effect": _EFFECT.get((kind, role)) or _EFFECT.get((kind, None)),
            "tx": hexid(ev.get("tx")), "receipt": hexid(ev.get("receipt")),
            "amount": amount(amt) if isinstance(amt, int) else None}


def commit_json(commit: Commit) -> list[Json]:
    """A block's commit as ``[{"validator", "round", "signature"}]``."""
    return [{"validator": acct(bytes(v)), "round": int(r), "signature": bytes(s).hex()} for v, r, s in commit]


def block_json(block: Block, commit: Commit, size: int) -> Json:
    """A stored block (``size`` bytes as stored) with its transactions' ids and kinds and ``commit``."""
    h = block.header
    return {"height": h.height, "hash": block.hash.hex(), "prev_hash": h.prev_hash.hex(), "time_ms": h.time_ms,
            "proposer": acct(h.proposer), "tx_root": h.tx_root.hex(), "state_root": h.state_root.hex(),
            "size_bytes": size, "txs": [{"id": t.id.hex(), "kind": t.KIND} for t in block.txs],
            "commit": commit_json(commit), "last_commit": commit_json(block.last_commit),
            "validators_hash": h.validators_hash.hex(), "next_validators_hash": h.next_validators_hash.hex()}


def tx_json(tx: Tx, height: int, index: int, block_hash: bytes) -> Json:
    """Transaction ``tx``, the ``index``-th of the block at ``height``: its fields and signatures."""
    return {"id": tx.id.hex(), "kind": tx.KIND, "height": height, "index": index, "block_hash": block_hash.hex(),
            "fields": tx_fields(tx), "signatures": [getattr(tx, s).hex() for s in tx.SIGS]}


def job_json(job: Job) -> Json:
    """A :class:`node.ledger.core.jobstate.Job` (the marketplace's ledger record)."""
    p = job.post
    losses = [None if x < 0 else x / 1e6 for x in job.losses]
    return {"id": p.job_id.hex(), "title": p.title, "status": job.status,
            "status_text": _STATUS_TEXT.get(job.status, job.status),
            "requester": acct(p.sender), "worker": acct(job.worker) if job.worker else None, "height": job.height,
            "deadline": p.deadline, "steps": p.steps, "next_step": job.next_step, "price": amount(p.price),
            "escrow_left": amount(job.escrow_left), "refunded": amount(job.refunded), "losses": losses,
            "segments": [s.hex() for s in job.segments], "adapter": hexid(job.adapter) or None,
            "fields": tx_fields(p, {"title", "job_id", "sender", "deadline", "steps", "nonce"})}


def archived_receipt_json(index: int, left_height: int, data: bytes) -> Json:
    """A receipt that left the hot state (:func:`node.ledger.core.history.summary` bytes ``data``, leaf ``index``
    of the history log, left at the end of block ``left_height``) in the shape of :func:`receipt_json`."""
    s = dict(zip(SUMMARY_FIELDS, unpack(data), strict=True))
    start, end, tokens = s["span_start"], s["span_end"], s["tokens"]
    inference = s["kind"] == "receipt"
    return {
        "id": s["id"].hex(), "kind": "inference" if inference else "training", "status": s["status"],
        "height": s["height"], "session_id": s["session_id"].hex() if inference else None,
        "job_id": s["session_id"].hex() if s["kind"] == "train_receipt" else None,
        "worker": acct(s["worker"]), "requester": acct(s["requester"]),
        "model_id": s["model_id"].hex() if inference else None, "span": [start, end] if inference else None,
        "tokens": tokens if inference else None, "work": tokens * (end - start) if inference else None,
        "price": amount(s["price"]), "opened_height": s["opened_height"] if inference else None,
        "sampling_probability_ppm": 0, "round": 0, "committee": [], "votes": [],
        "final_height": s["final_height"] or None,
        "payouts": [{"account": acct(a), "amount": amount(x)} for a, x in s["payouts"]],
        "slashed": amount(s["slashed"]), "fields": {}, "archived_height": left_height, "history_index": index,
    }


def history_proof_json(proof: dict[str, Any], commit: Commit, left_height: int) -> Json:
    """:func:`node.ledger.proofs.history_proof` with bytes as hex (``head`` as :func:`proof_json`)."""
    s = dict(zip(SUMMARY_FIELDS, unpack(proof["leaf"]), strict=True))
    return {"receipt_id": proof["receipt_id"].hex(), "archived_height": left_height,
            "header": [x.hex() if isinstance(x, bytes) else x for x in proof["header"]],
            "commit": [[v.hex(), r, sg.hex()] for v, r, sg in commit], "leaf": proof["leaf"].hex(),
            "index": proof["index"], "size": proof["size"], "path": [p.hex() for p in proof["path"]],
            "head": proof_json(proof["head"], commit),
            "summary": {k: (x.hex() if isinstance(x, bytes) else x) for k, x in s.items() if k != "tag"}
            | {"payouts": [[a.hex(), x] for a, x in s["payouts"]]}}


def history_proof_from_json(d: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[bytes, int, bytes]]]:
    """Inverse of :func:`history_proof_json`: ``(proof, commit)`` with bytes, for
    :func:`node.ledger.proofs.verify_history_proof`."""
    head, commit = proof_from_json(d["head"])
    proof = {"header": head["header"], "leaf": bytes.fromhex(d["leaf"]), "index": d["index"], "size": d["size"],
             "path": [bytes.fromhex(p) for p in d["path"]], "head": head}
    return proof, commit


def proof_json(proof: dict[str, Any], commit: Commit) -> Json:
    """Proof with bytes as hex; ``commit`` as ``[validator hex, round, signature hex]`` entries."""
    return {"header": [x.hex() if isinstance(x, bytes) else x for x in proof["header"]],
            "leaf": proof["leaf"].hex(), "index": proof["index"], "size": proof["size"],
            "path": [p.hex() for p in proof["path"]], "commit": [[v.hex(), r, s.hex()] for v, r, s in commit],
            "tree": proof.get("tree", "rfc9162"), "table": proof.get("table")}


def proof_from_json(d: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[bytes, int, bytes]]]:
    """Inverse of :func:`proof_json`: ``(proof, commit)`` with bytes, for the light-client verifiers."""
    h = d["header"]
    header = [h[0], h[1], bytes.fromhex(h[2]), h[3], bytes.fromhex(h[4]), bytes.fromhex(h[5]), bytes.fromhex(h[6])]
    proof = {"header": header, "leaf": bytes.fromhex(d["leaf"]), "index": d["index"], "size": d["size"],
             "path": [bytes.fromhex(p) for p in d["path"]], "tree": d.get("tree", "rfc9162"),
             "table": d.get("table")}
    return proof, [(bytes.fromhex(v), r, bytes.fromhex(s)) for v, r, s in d["commit"]]
