"""The requester's side of batch jobs: post an item file with escrow, describe a batch for the API, fetch the
accepted results (each with the workers that agreed on it)."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from typing import Any, Protocol

import trio

from ..encoding import DecodeError, format_amount, unpack
from ..identity import account_to_str
from ..ledger.core.batchstate import AuditStatus, Batch, Fate, Item, ItemStatus, item_key
from ..ledger.core.batchtx import GENERATE, BatchPost
from ..ledger.core.state import State, apply_tx
from ..ledger.core.tx import InvalidTx
from ..web.deps import CapabilityNode
from .content import fetch_content, result_check
from .items import ContentStore, ItemFile, ItemsError, parse_items
from .tasks import dequantize

DEFAULT_COMMIT_WINDOW = 600  # blocks (5 minutes on the devnet's 2 blocks/s): items are drawn 64 per block
DEFAULT_REVEAL_WINDOW = 120
FETCH_ROUNDS = 5  # rounds over an accepted item's agreeing workers before fetch_results gives up on it


class BatchError(ValueError):
    """A batch request that cannot be carried out (bad file or parameters, unknown batch, nothing accepted)."""


class RequesterNode(CapabilityNode, Protocol):
    """What :func:`post_batch`, :func:`fetch_results` and the batch routes (:mod:`node.batch.api`) need of
    :class:`node.runtime.Node` beyond :class:`~node.web.deps.CapabilityNode` (whose ``service(ContentStore)`` is
    the batch content store, :func:`content_store`): the model's tokenizer (``fetch_results`` decodes generated
    ids)."""

    def decode(self, ids: list[int]) -> str | None:
        """The text of token ``ids``, or None when the model has no tokenizer."""
        ...


def content_store(node: CapabilityNode) -> ContentStore:
    """The node's store of batch item files and results by content hash (the batch capability's
    :class:`~node.batch.items.ContentStore`, ``node.service(ContentStore)``).

    Raises:
        RuntimeError: the node has not built its capabilities yet (``Node.run`` builds them).
    """
    store = node.service(ContentStore)
    if store is None:
        raise RuntimeError("the node's capabilities are not built yet (Node.run builds them)")
    return store


def _amt(x: int) -> dict[str, str]:
    return {"base_units": str(x), "credits": format_amount(x)}


def check_lengths(f: ItemFile, max_tokens: int, max_length: int, vocab: int) -> None:
    """Refuse ``generate`` items whose ``prompt_ids`` cannot run (id outside the vocabulary, or prompt + tokens over
    ``max_length``). Text prompts are measured by the workers' tokenizer and get an ``error`` result instead.

    Raises:
        BatchError: naming the first bad line.
    """
    if max_tokens >= max_length:
        raise BatchError(f"max_tokens {max_tokens} leaves no room for a prompt in the model's {max_length} positions")
    for n, it in enumerate(f.items, start=1):
        ids = it.get("prompt_ids")
        if ids is None:
            continue
        if any(t >= vocab for t in ids):
            raise BatchError(f"line {n}: a prompt id is outside the vocabulary of {vocab}")
        if len(ids) + max_tokens > max_length:
            raise BatchError(f"line {n}: {len(ids)} prompt ids + {max_tokens} tokens exceed the model's "
                             f"max_length {max_length}")


async def post_batch(node: RequesterNode, data: bytes, *, kind: str, replication: int = 3, quorum: int | None = None,
                     price: int = 10**6, max_tokens: int = 32, max_reissues: int = 1,
                     commit_window: int = DEFAULT_COMMIT_WINDOW, reveal_window: int = DEFAULT_REVEAL_WINDOW
                     ) -> BatchPost:
    """Check the item file, keep it in the node's content store (workers fetch it from this node by its
    ``items_root``), and submit a :class:`BatchPost` escrowing ``n × k × price × (1 + max_reissues)`` base units.
    ``quorum`` defaults to ``k // 2 + 1``; ``max_tokens`` is ignored (0) for ``score``. The node must stay reachable
    until every item's workers have fetched the file.

    Raises:
        BatchError: a bad file (line number given) or parameters, or too little balance; nothing is submitted.
    """
    try:
        f = parse_items(data, kind)
    except ItemsError as e:
        raise BatchError(str(e)) from None
    if kind == GENERATE:
        m = node.manifest
        check_lengths(f, max_tokens, m.max_length, m.vocab_size)
    else:
        max_tokens = 0
    q = replication // 2 + 1 if quorum is None else quorum
    me = node.ident.account
    st = node.ledger.state
    post = BatchPost(node.genesis.domain, me, os.urandom(16), f.root, len(f.items), kind, max_tokens,
                     replication, q, price, max_reissues, commit_window, reveal_window,
                     node.ledger.next_nonce(me)).signed(node.ident)
    try:  # the ledger's own checks, so a bad batch is refused now with its reason
        apply_tx(st.copy(), post)
    except InvalidTx as e:
        if "nonce" not in str(e):  # a nonce ahead of the ledger is fine: earlier txs are queued
            raise BatchError(str(e)) from None
    content_store(node).put_items(f)
    await node.ledger.submit(post)
    return post


def items_of(state: State, b: Batch) -> list[Item]:
    """The assigned items of ``b`` in index order."""
    return [state.tables["batch_items"][item_key(b.post.batch_id, i)] for i in range(b.assigned)]


def batch_json(b: Batch, state: State, with_items: bool = False) -> dict[str, Any]:
    """A batch for the API: counts, progress (decided / n), agreement rate (revealed replicas of decided attempts
    that matched the quorum's result), and per-worker payouts and penalties (base units with decimals)."""
    p = b.post
    fates: Counter[Fate] = Counter()
    paid: dict[bytes, int] = defaultdict(int)
    taken: dict[bytes, int] = defaultdict(int)
    items = items_of(state, b)
    for it in items:
        for _a, w, fate, x in it.history:
            fates[fate] += 1
            if fate == Fate.AGREED:
                paid[w] += x
            elif fate == Fate.VINDICATED:  # its slash came back
                taken[w] -= x
            elif x:
                taken[w] += x
    revealed = fates[Fate.AGREED] + fates[Fate.DISSENTED] + fates[Fate.NO_QUORUM]
    workers = sorted(set(paid) | set(taken) | {w for it in items for w in it.workers})
    out: dict[str, Any] = {
        "batch_id": p.batch_id.hex(), "status": b.status.value, "kind": p.kind,
        "requester": account_to_str(p.sender), "items_root": p.items_root.hex(), "n_items": p.n_items,
        "max_tokens": p.max_tokens, "replication": p.replication, "quorum": p.quorum, "price": _amt(p.price),
        "max_reissues": p.max_reissues, "commit_window": p.commit_window, "reveal_window": p.reveal_window,
        "assigned": b.assigned, "decided": b.decided, "accepted": b.accepted,
        "refunded_items": sum(1 for it in items if it.status == ItemStatus.REFUNDED),
        "progress": b.decided / p.n_items,
        "agreement_rate": fates[Fate.AGREED] / revealed if revealed else None,
        "fates": {f.value: fates[f] for f in Fate},
        "audits": {a.value: sum(1 for it in items if it.audit == a) for a in AuditStatus if a != AuditStatus.NONE},
        "escrow": _amt(p.escrow()), "escrow_left": _amt(b.escrow_left), "paid": _amt(b.paid),
        "slashed": _amt(b.slashed), "refunded": _amt(b.refunded), "height": b.height,
        "final_height": b.final_height or None,
        "workers": [{"worker": account_to_str(w), "paid": _amt(paid[w]), "penalties": _amt(taken[w])}
                    for w in workers],
    }
    if with_items:
        out["items"] = [{"item": i, "status": it.status.value, "attempt": it.attempt,
                         "workers": [account_to_str(w) for w in it.workers], "quorum": it.quorum,
                         "committed": len(it.commits), "revealed": len(it.reveals),
                         "result": it.result.hex() or None, "agreed": [account_to_str(w) for w in it.agreed],
                         "audit": it.audit.value, "audit_committee": [account_to_str(w) for w in it.audit_committee],
                         "audit_votes": len(it.audit_votes)}
                        for i, it in enumerate(items)]
    return out


def decode_result(data: bytes, kind: str) -> dict[str, Any]:
    """The JSON form of result bytes: ``{"ids"}`` (generate), ``{"ids", "logprobs", "grid"}`` (score; each value a
    multiple of the grid), or ``{"error"}``.

    Raises:
        DecodeError: not a result map.
    """
    obj = unpack(data, max_size=1 << 24)
    if not isinstance(obj, dict):
        raise DecodeError("a result is a map")
    if "error" in obj:
        return {"error": str(obj["error"])}
    if kind == GENERATE:
        return {"ids": list(obj["ids"])}
    return {"ids": list(obj["ids"]), "logprobs": dequantize(list(obj["ll_q"])), "grid": 2.0 ** obj["grid_log2"]}


async def fetch_results(node: RequesterNode, batch_id: bytes) -> list[dict[str, Any]]:
    """The accepted results of a batch, in item order: ``{"item", "input", "result", "result_hash", "workers"}``,
    each fetched by hash from the workers that agreed (checked on arrival, kept in the local store). Refunded and
    undecided items are left out. Generated ids come with ``"text"`` when the model has a tokenizer.

    Raises:
        BatchError: unknown batch, or an accepted result no agreeing worker returned.
    """
    st = node.ledger.state
    b: Batch | None = st.tables["batches"].get(batch_id)
    if b is None:
        raise BatchError("no such batch")
    store = content_store(node)
    local = store.get(b.post.items_root)
    inputs = parse_items(local, b.post.kind).items if local is not None else None
    rows = []
    for i, it in enumerate(items_of(st, b)):
        if it.status != ItemStatus.ACCEPTED:
            continue
        for tries in range(FETCH_ROUNDS):  # each round asks every agreeing worker
            try:
                data = await fetch_content(node.host, store, it.result, list(it.agreed), result_check(it.result),
                                           batch=batch_id)
                res = decode_result(data, b.post.kind)
                break
            except (LookupError, DecodeError, KeyError, TypeError) as e:
                if tries == FETCH_ROUNDS - 1:
                    raise BatchError(f"item {i}: {e}") from None
                await trio.sleep(2.0 * (tries + 1))  # a busy worker refuses new streams for a while
        if "ids" in res and b.post.kind == GENERATE:
            text = node.decode(res["ids"])
            if text is not None:
                res["text"] = text
        rows.append({"item": i, "input": inputs[i] if inputs is not None else None, "result": res,
                     "result_hash": it.result.hex(), "workers": [account_to_str(w) for w in it.agreed]})
    return rows
