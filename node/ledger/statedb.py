"""The ledger state in LevelDB: flat keys per table, committed in the block's own ``WriteBatch``.

Keys (values msgpack, see :mod:`node.ledger.core.records`):
  ``S/m``                  ``[FORMAT, height, last block hash, sequence counter, {table: entries}, state root
                           (:meth:`node.ledger.core.smt.Root.to_bytes`)]``
  ``S/u``                  the undo record of the head block: ``[height - 1, its hash, its counter,
                           {table: [[key, value before or None], ...]}, its state root]`` (what the head
                           header commits to)
  ``S/<t>/`` + key         one entry of table ``<t>`` (:data:`PREFIX`)
  ``T/n/``, ``T/x/``       the state tree's nodes and stale-node index (:mod:`node.ledger.core.tree`)

A node opens the state it last committed (:func:`open_state`) instead of replaying the chain: start time does not
grow with the chain's length. Each block's changes, the new ``S/m`` and ``S/u`` are written with the block in one
synced batch (:func:`stage_state`, then :func:`settle_state`), so after a crash at any point the stored state is
the state after the stored head, whole. Full re-verification from genesis is
:meth:`node.ledger.store.LedgerStore.verify`.
"""

from __future__ import annotations

from typing import Any

from ..encoding import pack, unpack_local
from .core import tree as tr
from .core.kv import _DEL, Batch, StoreRoot, Table
from .core.records import CODECS, MAPS, SETS
from .core.smt import Root
from .core.state import State
from .genesis import Genesis

FORMAT = 2  # 1: no state root in S/m (read as no stored state: replayed once)
META = b"S/m"
UNDO = b"S/u"
PREFIX = {"accounts": b"S/a/", "receipts": b"S/r/", "evidence": b"S/e/", "sessions": b"S/s/", "jobs": b"S/j/",
          "runs": b"S/n/", "open_receipts": b"S/o/", "open_jobs": b"S/p/", "open_runs": b"S/q/",
          "history": b"S/h/", "retire": b"S/t/", "validators": b"S/v/",
          "batches": b"S/b/", "batch_items": b"S/i/", "batch_due": b"S/d/", "batch_workers": b"S/w/",
          "open_batches": b"S/y/", "disputes": b"S/z/"}
CACHE_ITEMS = {"receipts": 16384, "jobs": 4096, "runs": 1024}  # decoded values kept (others: kv.CACHE_ITEMS)


class StateFormatError(ValueError):
    """The stored state was written by another format version or is damaged."""


def read_meta(db: Any) -> tuple[int, bytes, int, dict[str, int], Root] | None:
    """``(height, last hash, counter, {table: entries}, state root)`` of the stored state, or None when none is
    stored (or an older format's: the store replays the chain once and writes this one).

    Raises:
        StateFormatError: a newer format, or a damaged record.
    """
    raw = db.get(META)
    if raw is None:
        return None
    m = unpack_local(raw)
    if isinstance(m, list) and m and isinstance(m[0], int) and m[0] < FORMAT:
        return None
    if not (isinstance(m, list) and len(m) == 6 and m[0] == FORMAT):
        raise StateFormatError(f"stored state format {m[0] if isinstance(m, list) and m else '?'}, "
                               f"this node reads {FORMAT}")
    return int(m[1]), bytes(m[2]), int(m[3]), {str(k): int(v) for k, v in m[4].items()}, Root.from_bytes(m[5])


def open_state(db: Any, genesis: Genesis) -> State:
    """The stored state, its tables reading LevelDB through bounded caches (nothing is loaded up front).

    Raises:
        StateFormatError: no state stored, or another format.
    """
    meta = read_meta(db)
    if meta is None:
        raise StateFormatError("no state stored")
    height, last_hash, seq, counts, root = meta
    tables = {n: Table(StoreRoot(db, PREFIX[n], CODECS[n], CACHE_ITEMS.get(n, 65536), counts.get(n)))
              for n in MAPS + SETS}
    return State(genesis.domain, genesis.params, genesis.validators, height, last_hash, seq, tables=tables,
                 tree=tr.settled(db, root))


def _meta(state: State, root: Root, counts: dict[str, int] | None = None) -> bytes:
    counts = counts or {n: len(state.tables[n]) for n in MAPS + SETS}  # len: O(depth), from the counts
    return pack([FORMAT, state.height, state.last_hash, state.seq, counts, root.to_bytes()])


def dump_state(db: Any, batch: Batch, state: State) -> None:
    """Write every entry of ``state`` (any layout) and its whole state tree (built afresh, O(n log n)) into
    ``batch``, after deleting whatever state is stored."""
    for prefix in [PREFIX[n] for n in MAPS + SETS] + [tr.NODES, tr.STALE]:
        for k in db.iterator(prefix=prefix, include_value=False):
            batch.delete(k)
    whole = state.tree is not None and state._parent is None and state.tree.parent is None \
        and isinstance(state.tree.base, tr._Shared) and not state.tree.base.nodes
    fresh = state if whole else State(state.chain_id, state.params, state.validators, state.height,
                                      state.last_hash, state.seq)  # (a tree built from every entry is reused)
    for name in MAPS + SETS:
        codec = CODECS[name]
        for k, v in state.tables[name].items():
            batch.put(PREFIX[name] + k, codec.dumps(v))
            if not whole:
                fresh.tables[name][k] = v
    root = fresh.state_root()
    assert fresh.tree is not None
    if root != state.state_root():
        raise StateFormatError("the state's root differs from its entries' (a bug: report it)")
    tr.stage(batch, fresh.tree, 0, lambda bound: iter(()))
    batch.put(META, _meta(state, fresh.tree.root))
    batch.delete(UNDO)


def write_raw(db: Any, batch: Batch, entries: Any, tree: Any, height: int, last_hash: bytes, seq: int,
              counts: dict[str, int]) -> None:
    """Write stored bytes as they are (``(table, key, bytes)``, from a checked snapshot) with their ``tree``
    and meta into ``batch``, after deleting whatever state is stored."""
    for prefix in [PREFIX[n] for n in MAPS + SETS] + [tr.NODES, tr.STALE]:
        for k in db.iterator(prefix=prefix, include_value=False):
            batch.delete(k)
    for name, k, raw in entries:
        batch.put(PREFIX[name] + k, raw)
    tr.stage(batch, tree, 0, lambda bound: iter(()))
    batch.put(META, pack([FORMAT, height, last_hash, seq, counts, tree.root.to_bytes()]))
    batch.delete(UNDO)


def stage_state(batch: Batch, parent: State, state: State) -> None:
    """Write ``state``'s changes from ``parent`` (the stored state; ``state`` was built on it by applying one
    block), the new ``S/m`` and the undo record into ``batch``; then call :func:`settle_state` once the batch
    is written. ``parent`` stays readable, exactly as it was (it becomes a view over the new stored state).

    Raises:
        ValueError: ``state`` is not over the store, or not built on ``parent``.
    """
    for name in MAPS + SETS:
        t = state.tables[name]
        if not isinstance(t.root, StoreRoot):
            raise ValueError(f"the state's {name} are not over the store: open it with LedgerStore.replay()")
        if t._bottom() is not parent.tables[name] and (t.parent is not None or t.writes):
            raise ValueError(f"the state's {name} were not built on the stored state")
    undo: dict[str, list] = {}
    counts = {n: len(state.tables[n]) for n in MAPS + SETS}
    state.state_root()  # before the tables fold: the root comes from the block's own writes
    assert state.tree is not None and state.tree.root is not None and parent.tree is not None
    db = parent.tables["accounts"].root.backend  # type: ignore[union-attr]
    tr.stage(batch, state.tree, state.height,
             lambda bound: db.iterator(start=tr.STALE, stop=bound, include_value=False))
    encoded = state.encoded or {}
    for name in MAPS + SETS:
        before = state.tables[name].stage(batch, encoded.get(name))
        codec = CODECS[name]
        undo[name] = [[k, None if v is _DEL else codec.encode(v)] for k, v in sorted(before.items())]
    batch.put(META, _meta(state, state.tree.root, counts))
    parent_root = parent.tree.root or Root(parent.state_root(), 0)
    batch.put(UNDO, pack([parent.height, parent.last_hash, parent.seq, undo, parent_root.to_bytes()]))


def settle_state(state: State) -> None:
    """After the batch of :func:`stage_state` is written: ``state`` reads the stored state directly."""
    for name in MAPS + SETS:
        state.tables[name].settle()
    state.encoded = None
    assert state.tree is not None and state.tree.root is not None
    state.tree = tr.settled(state.tables["accounts"].root.backend, state.tree.root,  # type: ignore[union-attr]
                            state.tree)  # its nodes stay in memory a while (tree.NodeCache)


def _view(state: State, height: int, last_hash: bytes, seq: int, befores: dict[str, dict], tree: Any) -> State:
    tables = {n: state.tables[n].undo_view(befores.get(n, {})) for n in MAPS + SETS}
    return State(state.chain_id, state.params, state.validators, height, last_hash, seq, tables=tables, tree=tree)


def parent_view(db: Any, state: State) -> State:
    """The state after the block before the head, read from the stored undo record (``state`` at genesis).

    Raises:
        StateFormatError: the undo record does not belong to ``state``'s head.
    """
    raw = db.get(UNDO)
    if raw is None:
        return state
    height, last_hash, seq, undo, root = unpack_local(raw)
    if height != state.height - 1:
        raise StateFormatError(f"undo record for height {height + 1}, the stored state is at {state.height}")
    befores = {n: {bytes(k): (_DEL if v is None else CODECS[n].decode_local(v)) for k, v in rows}
               for n, rows in undo.items() if n in CODECS}
    return _view(state, height, bytes(last_hash), seq, befores, tr.settled(db, Root.from_bytes(root)))


def differences(a: State, b: State, limit: int = 10) -> list[str]:
    """Up to ``limit`` descriptions of how two states differ (height, hash, counter, any table entry)."""
    out: list[str] = []
    for what, x, y in (("height", a.height, b.height), ("last hash", a.last_hash, b.last_hash),
                       ("counter", a.seq, b.seq)):
        if x != y:
            out.append(f"{what}: {x!r} != {y!r}")
    for name in MAPS + SETS:
        ta, tb = a.tables[name], b.tables[name]
        for k in sorted(set(ta) | set(tb)):
            if len(out) >= limit:
                return out
            va, vb = ta.get(k), tb.get(k)
            if va != vb:
                out.append(f"{name} {k.hex()[:16]}: {'absent' if va is None else 'differs'} / "
                           f"{'absent' if vb is None else 'differs'}")
    return out
