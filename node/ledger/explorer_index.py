"""The explorer's index entries of a block (``i/`` keys of :mod:`node.ledger.store`): what each block writes
beside itself so that an account's history, a transaction's place and a block's height are one lookup away.
Derived data: :meth:`node.ledger.store.LedgerStore.replay` rebuilds it from the blocks when ``INDEX_VERSION``
changes."""

from __future__ import annotations

from typing import Any

from ..encoding import pack
from .core.block import Block
from .core.kv import Table
from .core.staking import evidence_of
from .core.state import FINAL, State
from .core.tabs import EpochBatch, Reveal
from .core.tabs.state import Settlement, SettlementStatus


def _h(height: int) -> bytes:
    return height.to_bytes(8, "big")


INDEX_VERSION = 2  # 2: epoch batches (settlement_entries)
# tx fields naming accounts (a run's aggregator and worker before the ``sender`` property that aliases them)
_PARTIES = ("aggregator", "worker", "sponsor", "sender", "recipient", "requester", "voter", "validator")


def index_block(block: Block, old: State, new: State) -> list[tuple[bytes, bytes]]:
    """The ``i/`` index entries of ``block`` (applied to ``old`` giving ``new``), as ``(key, value)`` pairs.

    History events (maps with bytes values): ``{"k": tx kind, "tx": id, "role": field, "amount"?}`` for every
    account a transaction names; ``{"k": "payout" | "refund" | "paid" | "slash", "receipt": id, "amount"}`` when a
    receipt becomes final in this block (``paid``: the requester's escrow spent on it).
    """
    hb = _h(block.height)
    out: list[tuple[bytes, bytes]] = [(b"i/k" + block.hash, hb)]
    seq = 0

    def event(account: bytes, ev: dict[str, Any]) -> None:
        nonlocal seq
        out.append((b"i/a" + account + hb + seq.to_bytes(4, "big"), pack(ev)))
        seq += 1

    written = _written_receipts(old, new)
    if written is None:
        changed = list(old.open_receipts)
    else:  # the written ones that were open, in the open set's order (its sequence numbers): O(written), no scan
        seqs = old.tables["open_receipts"]
        order = []
        for rid in written:
            q = seqs.get(rid)
            if q is not None:
                order.append((q, rid))
        changed = [rid for _, rid in sorted(order)]
    for i, tx in enumerate(block.txs):
        out.append((b"i/t" + tx.id, pack([block.height, i, tx.KIND])))
        amount = getattr(tx, "amount", None) or getattr(tx, "price", None)
        key = getattr(tx, "key", None)  # evidence transactions
        if isinstance(key, bytes) and key in evidence_of(new):  # its slash (node.ledger.core.staking)
            amount = evidence_of(new)[key][1]
        parties: dict[bytes, str] = {}
        for f in _PARTIES:
            a = getattr(tx, f, None)
            if isinstance(a, bytes) and len(a) == 32:
                parties.setdefault(a, f)
        for a, role in parties.items():
            event(a, {"k": tx.KIND, "tx": tx.id, "role": role, **({"amount": amount} if amount else {})})
        if tx.id in new.receipts and tx.id not in old.receipts:
            changed.append(tx.id)
        revealed = tx.tab_receipt.id if isinstance(tx, Reveal) else None  # a receipt revealed from an epoch batch
        if revealed is not None and revealed in new.receipts and revealed not in old.receipts:
            changed.append(revealed)
    for rid in changed:
        rec, prev = new.receipts.get(rid), old.receipts.get(rid)
        if rec is None or rec is prev:
            continue
        r = rec.receipt
        roles = {} if prev is not None else {r.worker: "worker", r.requester: "requester"}
        for m in rec.committee:
            if prev is None or m not in prev.committee:
                roles[m] = "committee"
        for a, role in roles.items():
            out.append((b"i/r" + a + _h(rec.height) + rid, pack(role)))
        if rec.status in FINAL and (prev is None or prev.status not in FINAL):
            event(r.requester, {"k": "paid", "receipt": rid, "amount": r.price})
            for a, amt in rec.payouts:
                event(a, {"k": "refund" if a == r.requester else "payout", "receipt": rid, "amount": amt})
            if rec.slashed:
                event(r.worker, {"k": "slash", "receipt": rid, "amount": rec.slashed})
    out += settlement_entries(block, old, new)
    out += valset_entries(old, new)
    return out


BATCH_PREFIX = b"i/e"  # + batch key (+ ``f``; + ``d`` + leaf index): an epoch batch's story (settlement_entries)


def settlement_entries(block: Block, old: State, new: State) -> list[tuple[bytes, bytes]]:
    """What the explorer keeps of epoch batches (issue 37) once the state prunes them: under ``i/e`` + batch key
    the batch's transaction id (written when a block includes it); under ``i/e`` + key + ``f`` ``[fate, height]``
    when it leaves the state (fate ``paid`` or ``refunded``); under ``i/e`` + key + ``d`` + leaf index (8 bytes)
    the id of each receipt revealed from it."""
    out: list[tuple[bytes, bytes]] = []
    olds, news = old.tables["settlements"], new.tables["settlements"]
    for tx in block.txs:
        if isinstance(tx, EpochBatch) and tx.key in news and tx.key not in olds:
            out.append((BATCH_PREFIX + tx.key, tx.id))
        elif isinstance(tx, Reveal) and tx.tab_receipt.id in new.receipts:
            out.append((BATCH_PREFIX + tx.batch_key + b"d" + _h(tx.index), tx.tab_receipt.id))
    for key in _left(olds, news):
        was: Settlement = olds[key]
        # in its settle window with no dispute open and its time come: paid; any other way out (a withheld reveal,
        # an invalid verdict on a drawn or disputed receipt) refunds it to its tabs
        paid = was.status == SettlementStatus.WINDOW and not was.disputes and block.height >= was.due
        out.append((BATCH_PREFIX + key + b"f", pack(["paid" if paid else "refunded", block.height])))
    return out


def _left(olds: Table[bytes, Settlement], news: Table[bytes, Settlement]) -> list[bytes]:
    """Keys of the settlements ``olds`` holds and ``news`` no longer does (only the keys written in between when
    ``news`` is an overlay over ``olds``)."""
    written = _written(olds, news)
    keys = written if written is not None else dict(olds.items())
    return [k for k in keys if k in olds and k not in news]


def _written(base: Table[bytes, Any], top: Table[bytes, Any]) -> dict[bytes, Any] | None:
    """Every key written in ``top``'s overlays above ``base`` (a superset is fine), or None when ``top`` is not an
    overlay stack over ``base``."""
    t: Table[bytes, Any] | None = top
    while t is not None and t is not base:
        t = t.parent
    return None if t is None else top.changes()


def _written_receipts(old: State, new: State) -> dict[bytes, Any] | None:
    """Every receipt key written between ``old`` and ``new`` (a superset is fine), or None when ``new``'s
    receipts are not an overlay stack over ``old``'s (then every open receipt is compared). A receipt not
    written reads as the very object ``old`` holds, which :func:`index_block` skips: looking up only the written
    ones gives the same entries without two lookups per open receipt."""
    return _written(old.tables["receipts"], new.tables["receipts"])


VALSET_PREFIX = b"i/v"  # + height (8 bytes): the validator set from that height on (written when it changes)


def valset_entries(old: State, new: State) -> list[tuple[bytes, bytes]]:
    """The ``i/v`` entry of the block that took ``old`` to ``new``: the set of height ``new.height + 2`` when it
    differs from ``old``'s set of that height (CometBFT's state DB keeps validator sets the same way, by the height
    they last changed). None on a chain whose set is fixed in genesis."""
    if not new.params.min_validator_bond:
        return []
    vs = new.next_valset()
    return [] if vs == old.next_valset() else [(VALSET_PREFIX + _h(new.height + 2), vs.to_bytes())]
