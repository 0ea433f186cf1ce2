"""History that ends: final receipts leave the hot state into an append-only RFC 9162 Merkle log (pure).

A plain inference receipt (:class:`node.ledger.core.tx.Receipt`) that became final at height ``f`` leaves the state
at height ``leave = max(f + retention_blocks, opened_height + receipt_max_age + 1)`` (a receipt that left can no
longer be replayed: inclusion needs ``opened_height + receipt_max_age >= parent height``). Its summary
(:func:`summary`: id, worker, requester, price, status, inclusion and final height, payouts, slash) is appended to
the log and its ``receipts`` and ``sessions`` entries are deleted. At most :data:`MAX_RETIRE_PER_BLOCK` leave in one
block, oldest first; the rest move to the next height, ahead of those scheduled there. A job's or a run's receipts
(training receipts; round receipts and aggregates) leave ``retention_blocks`` after both they and their job or run
are final (:func:`schedule_owner_leave`, called when the job or run ends): until then the job or run reads them,
and afterwards nothing can replay them (a job or run that ended accepts no receipt).

The log is RFC 9162 §2.1 (leaf hash ``H(0x00 ‖ d)``, node ``H(0x01 ‖ l ‖ r)``, :func:`node.encoding.leaf_hash`).
Its head (:class:`LogHead`: size, root, frontier) is the entry ``history/head`` of the state, so the sparse Merkle
state root of every header commits to it; appending is O(log n) through the frontier (the roots of the perfect
subtrees the size decomposes into, largest first: the "compact range" of Certificate Transparency logs). The
perfect subtree hashes made by each append (:attr:`Append.nodes`) are stored by the edge
(:mod:`node.ledger.store`, keys ``X/``) so that :func:`inclusion_path` can serve audit paths in O(log² n) reads
through a :class:`NodeReader`.

State tables used (:data:`node.ledger.core.records.MAPS`): ``history`` (``b"head"`` -> ``[size, root, frontier]``)
and ``retire`` (leave height, 8 bytes big-endian -> receipt ids, in finalisation order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ...encoding import H, leaf_hash, node_hash, pack
from .historyparams import HISTORY_PART
from .kv import Codec
from .module import Module, ReceiptKind, ident
from .view import StateView

MAX_RETIRE_PER_BLOCK = 256  # receipts that leave the hot state in one block (the rest wait a height)
HEAD_KEY = b"head"
EMPTY_LOG_ROOT = H(b"")  # RFC 9162: the hash of an empty list


class NodeReader(Protocol):
    """Where the stored perfect subtree hashes are read: ``history_node(level, index)`` is the root of leaves
    ``[index·2^level, (index+1)·2^level)`` (level 0: the leaf hashes), or None when not held."""

    def history_node(self, level: int, index: int) -> bytes | None: ...


class HistoryMissing(LookupError):
    """A subtree hash needed for a proof is not held (e.g. a node state-synced after that receipt left)."""


@dataclass(frozen=True)
class LogHead:
    """The log's size (leaves), its RFC 9162 root and its frontier (perfect subtree roots, largest first)."""

    size: int = 0
    root: bytes = EMPTY_LOG_ROOT
    frontier: tuple[bytes, ...] = ()

    def to_plain(self) -> list[Any]:
        return [self.size, self.root, list(self.frontier)]

    @classmethod
    def from_plain(cls, x: Any) -> LogHead:
        """Raises: ValueError for a malformed head."""
        if not (isinstance(x, list) and len(x) == 3 and isinstance(x[0], int) and isinstance(x[1], bytes)
                and isinstance(x[2], list) and len(x[2]) == bin(x[0]).count("1")):
            raise ValueError("malformed history head")
        return cls(x[0], x[1], tuple(bytes(f) for f in x[2]))


@dataclass(frozen=True)
class Append:
    """One appended leaf: its index, its data and the perfect subtree hashes it completed ``(level, index, hash)``."""

    index: int
    receipt_id: bytes
    data: bytes
    nodes: tuple[tuple[int, int, bytes], ...]


def root_of(frontier: tuple[bytes, ...]) -> bytes:
    """The RFC 9162 Merkle Tree Hash of a log from its frontier (largest subtree first): O(log n)."""
    if not frontier:
        return EMPTY_LOG_ROOT
    h = frontier[-1]
    for f in reversed(frontier[:-1]):
        h = node_hash(f, h)
    return h


def append(head: LogHead, receipt_id: bytes, data: bytes) -> tuple[LogHead, Append]:
    """Append leaf ``data`` to the log: the new head and what the edge stores. O(log n) hashes."""
    n = head.size
    h = leaf_hash(data)
    nodes = [(0, n, h)]
    frontier = list(head.frontier)
    level, idx = 0, n
    while idx & 1:  # the subtrees of equal size merge, as binary addition carries
        left = frontier.pop()
        h = node_hash(left, h)
        level, idx = level + 1, idx >> 1
        nodes.append((level, idx, h))
    frontier.append(h)
    fr = tuple(frontier)
    return LogHead(n + 1, root_of(fr), fr), Append(n, receipt_id, data, tuple(nodes))


def _largest_pow2_below(n: int) -> int:
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


def subtree_hash(store: NodeReader, start: int, size: int) -> bytes:
    """The Merkle Tree Hash of leaves ``[start, start + size)`` where ``start`` is a multiple of the largest power
    of two not above ``size`` (as in every split of RFC 9162's recursion). Raises :class:`HistoryMissing`."""
    if size & (size - 1) == 0:
        level = size.bit_length() - 1
        h = store.history_node(level, start >> level)
        if h is None:
            raise HistoryMissing(f"history subtree {level}/{start >> level} is not held by this node")
        return h
    k = _largest_pow2_below(size)
    return node_hash(subtree_hash(store, start, k), subtree_hash(store, start + k, size - k))


def inclusion_path(store: NodeReader, index: int, size: int) -> list[bytes]:
    """RFC 9162 §2.1.3.1 audit path ``PATH(index, D[0:size])``, bottom-up, from the stored subtree hashes.

    Raises:
        IndexError: ``index`` is not below ``size``. HistoryMissing: a needed hash is not held.
    """
    if not 0 <= index < size:
        raise IndexError("leaf index out of range")
    out: list[bytes] = []
    start, n, m = 0, size, index
    while n > 1:  # top-down, prepending (the path is listed bottom-up)
        k = _largest_pow2_below(n)
        if m < k:
            out.append(subtree_hash(store, start + k, n - k))
            n = k
        else:
            out.append(subtree_hash(store, start, k))
            start, m, n = start + k, m - k, n - k
    return out[::-1]


def summary(rec: Any) -> bytes:
    """The leaf data of a receipt record leaving the state: msgpack of ``[b"tally/history/v1", id, kind, worker,
    requester, price (base units), status, inclusion height, final height, [[account, base units]...] payouts,
    slashed (base units), *tail]``, where the receipt's own ``history_tail()`` gives the last six fields: ``session
    id, opened height, model id, span start, span end, tokens`` of an inference receipt (plain or from a tab); for a
    job's or a run's receipt (kind ``train_receipt``, ``round_receipt``, ``round_aggregate``) the job or run id, the
    round (0 for a job), an empty model id, the steps ``[step_start, step_end)`` of a training receipt (``[0,
    steps)`` of a round receipt, ``[0, 0)`` of an aggregate), and the number of steps."""
    r = rec.receipt
    head = [b"tally/history/v1", r.id, r.KIND, r.worker, r.requester, r.price, rec.status, rec.height,
            rec.final_height, [list(p) for p in rec.payouts], rec.slashed]
    return pack([*head, *r.history_tail()])


SUMMARY_FIELDS = ("tag", "id", "kind", "worker", "requester", "price", "status", "height", "final_height",
                  "payouts", "slashed", "session_id", "opened_height", "model_id", "span_start", "span_end",
                  "tokens")


def leave_height(final_height: int, opened_height: int, retention_blocks: int, receipt_max_age: int) -> int:
    """The height at whose end a receipt final at ``final_height`` leaves the state (see the module docstring)."""
    return max(final_height + retention_blocks, opened_height + receipt_max_age + 1)


def height_key(h: int) -> bytes:
    return h.to_bytes(8, "big")


def read_head(s: Any) -> LogHead:
    """The log head held in state ``s`` (an empty log when absent)."""
    raw = s.tables["history"].get(HEAD_KEY)
    return LogHead() if raw is None else LogHead.from_plain(raw)


def schedule_leave(s: Any, rec: Any, kind: ReceiptKind | None) -> None:
    """Called when receipt record ``rec`` became final in working state ``s`` (:mod:`node.ledger.core.receipts`,
    or its module): when ``retention_blocks`` is set, schedule it to leave. ``kind`` is its module's
    :class:`~node.ledger.core.module.ReceiptKind` (None: the core's plain receipt); a kind whose
    :meth:`~node.ledger.core.module.ReceiptKind.owner_final` is None (an inference receipt) leaves at
    :func:`leave_height`; one that belongs to a job or run leaves ``retention_blocks`` after both are final, and
    is scheduled by :func:`schedule_owner_leave` while its owner is open."""
    p = s.params
    r = rec.receipt
    if not p.retention_blocks:
        return
    owner = None if kind is None else kind.owner_final(s, r)
    if owner is None:
        k = height_key(leave_height(rec.final_height, r.opened_height, p.retention_blocks, p.receipt_max_age))
    else:
        if not owner:  # its job or run is open: scheduled by schedule_owner_leave when it ends
            return
        k = height_key(max(rec.final_height, owner) + p.retention_blocks)
    s.tables["retire"][k] = (*s.tables["retire"].get(k, ()), r.id)


def schedule_owner_leave(s: Any, receipt_ids: Any, final_height: int, final_status: Any) -> None:
    """A job or run ended at ``final_height`` in working state ``s``: schedule its receipts that are already final
    (status in ``final_status``) to leave ``retention_blocks`` after the later of the two (its other receipts are
    scheduled by :func:`schedule_leave` when they become final)."""
    p = s.params
    if not p.retention_blocks:
        return
    t = s.tables["retire"]
    for rid in receipt_ids:
        rec = s.receipts.get(rid)
        if rec is not None and rec.status in final_status:
            k = height_key(max(rec.final_height, final_height) + p.retention_blocks)
            t[k] = (*t.get(k, ()), rid)


def retire(s: Any, height: int) -> list[Append]:
    """End of block ``height`` in working state ``s``: the receipts scheduled to leave at ``height`` (at most
    :data:`MAX_RETIRE_PER_BLOCK`, oldest first; the rest move to ``height + 1``) leave ``receipts`` and
    ``sessions`` and are appended to the log. O(1) lookups when none is due. Returns the appends (also
    collected in ``s.archived`` for the store) in log order."""
    t = s.tables["retire"]
    k = height_key(height)
    due = t.get(k)
    if due is None:
        return []
    del t[k]
    now, later = due[:MAX_RETIRE_PER_BLOCK], due[MAX_RETIRE_PER_BLOCK:]
    if later:
        k2 = height_key(height + 1)
        t[k2] = (*later, *t.get(k2, ()))
    head = read_head(s)
    out: list[Append] = []
    for rid in now:
        rec = s.tables["receipts"].pop(rid, None)
        if rec is None:  # pragma: no cover - scheduled once, when final; nothing else deletes a receipt
            continue
        if rec.receipt.KIND == "receipt":
            s.tables["sessions"].pop(H(rec.receipt.worker, rec.receipt.session_id), None)
        head, a = append(head, rid, summary(rec))
        out.append(a)
    s.tables["history"][HEAD_KEY] = head.to_plain()
    s.archived.extend(out)
    return out


# ------------------------------------------------------------------ the module (node.ledger.core.modules)


def _end_block(s: StateView, height: int, _block_hash: bytes) -> None:
    retire(s, height)


def _retire_ids(x: Any) -> tuple[bytes, ...]:
    return tuple(bytes(i) for i in x)


MODULE = Module("history", maps={
    "history": Codec(ident, ident),  # b"head" -> [size, root, frontier] (LogHead)
    "retire": Codec(list, _retire_ids),  # leave height -> receipt ids
}, store_keys={"history": b"h", "retire": b"t"},
    params=HISTORY_PART,
    on_end_block=_end_block)  # final receipts past the retention window leave (none while retention_blocks is 0)

__all__ = [
    "EMPTY_LOG_ROOT",
    "HEAD_KEY",
    "MAX_RETIRE_PER_BLOCK",
    "SUMMARY_FIELDS",
    "Append",
    "HistoryMissing",
    "LogHead",
    "NodeReader",
    "append",
    "height_key",
    "inclusion_path",
    "leave_height",
    "read_head",
    "retire",
    "root_of",
    "schedule_leave",
    "schedule_owner_leave",
    "subtree_hash",
    "summary",
]
