"""The ledger state in LevelDB: flat keys per table, committed in the block's own ``WriteBatch``.

Keys (values msgpack, see :mod:`node.ledger.core.records`):
  ``S/m``                  ``[FORMAT, height, last block hash, sequence counter, {table: entries}, state root
                           (:meth:`node.ledger.core.smtnode.Root.to_bytes`)]``
  ``S/u``                  the undo record of the head block: ``[height - 1, its hash, its counter,
                           {table: [[key, value before or None], ...]}, its state root]`` (what the head
                           header commits to)
  ``S/<t>/`` + key         one entry of table ``<t>`` (:data:`PREFIX`)
  ``T/N/``, ``T/X/``, ``T/v``  the state tree's nodes, stale-node index and layout (:mod:`node.ledger.core.tree`);
                           ``T/n/``, ``T/x/`` held the binary layout of stores written before it, ``T/m/`` is the
                           scratch space of the one-time rebuild from that layout (:func:`migrate_tree`)

A node opens the state it last committed (:func:`open_state`) instead of replaying the chain: start time does not
grow with the chain's length. Each block's changes, the new ``S/m`` and ``S/u`` are written with the block in one
synced batch (:func:`stage_state`, then :func:`settle_state`), so after a crash at any point the stored state is
the state after the stored head, whole. Full re-verification from genesis is
:meth:`node.ledger.store.LedgerStore.verify`.
"""

from __future__ import annotations

import logging
from typing import Any

from ..encoding import pack, unpack_local
from .core import jmt, tree as tr
from .core.kv import _DEL, Batch, StoreRoot, Table
from .core.modules import STORE_KEYS
from .core.records import CODECS, MAPS, SETS
from .core.smtnode import Root
from .core.state import State
from .genesis import Genesis

log = logging.getLogger(__name__)

FORMAT = 2  # 1: no state root in S/m (read as no stored state: replayed once)
META = b"S/m"
UNDO = b"S/u"
PREFIX = {t: b"S/" + k + b"/" for t, k in STORE_KEYS.items()}  # table -> its LevelDB prefix (the module's store key)
SCRATCH = b"T/m/"  # + tree key -> leaf value, during a migration: the leaves, sorted by LevelDB
TREE_PREFIXES = [tr.NODES, tr.STALE, tr.OLD_NODES, tr.OLD_STALE, SCRATCH]
MIGRATE_BATCH = 20_000  # writes per LevelDB batch during a migration (bounds its memory)
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
    """The stored state, its tables reading LevelDB through bounded caches (nothing is loaded up front). A store
    whose state tree is still in the binary node layout is rebuilt in the 16-ary one first, once
    (:func:`migrate_tree`: about a minute per 10^6 entries).

    Raises:
        StateFormatError: no state stored, another format, or a tree layout rebuild whose roots do not match.
    """
    meta = read_meta(db)
    if meta is None:
        raise StateFormatError("no state stored")
    migrate_tree(db)
    height, last_hash, seq, counts, root = meta
    tables: dict[str, Table[Any, Any]] = {
        n: Table(StoreRoot(db, PREFIX[n], CODECS[n], CACHE_ITEMS.get(n, 65536), counts.get(n))) for n in MAPS + SETS}
    return State(genesis.domain, genesis.params, genesis.validators, height, last_hash, seq, tables=tables,
                 tree=tr.settled(db, root))


def _meta(state: State, root: Root, counts: dict[str, int] | None = None) -> bytes:
    counts = counts or {n: len(state.tables[n]) for n in MAPS + SETS}  # len: O(depth), from the counts
    return pack([FORMAT, state.height, state.last_hash, state.seq, counts, root.to_bytes()])


def dump_state(db: Any, batch: Batch, state: State) -> None:
    """Write every entry of ``state`` (any layout) and its whole state tree (built afresh, O(n log n)) into
    ``batch``, after deleting whatever state is stored."""
    for prefix in [PREFIX[n] for n in MAPS + SETS] + TREE_PREFIXES:
        for k in db.iterator(prefix=prefix, include_value=False):
            batch.delete(k)
    batch.put(tr.LAYOUT_KEY, tr.LAYOUT)
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
    assert fresh.tree is not None and fresh.tree.root is not None
    if root != state.state_root():
        raise StateFormatError("the state's root differs from its entries' (a bug: report it)")
    tr.stage(batch, fresh.tree, 0, lambda bound: iter(()))
    batch.put(META, _meta(state, fresh.tree.root))
    batch.delete(UNDO)


def write_raw(db: Any, batch: Batch, entries: Any, tree: Any, height: int, last_hash: bytes, seq: int,
              counts: dict[str, int]) -> None:
    """Write stored bytes as they are (``(table, key, bytes)``, from a checked snapshot) with their ``tree``
    and meta into ``batch``, after deleting whatever state is stored."""
    for prefix in [PREFIX[n] for n in MAPS + SETS] + TREE_PREFIXES:
        for k in db.iterator(prefix=prefix, include_value=False):
            batch.delete(k)
    batch.put(tr.LAYOUT_KEY, tr.LAYOUT)
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
    undo: dict[str, list[list[Any]]] = {}
    counts = {n: len(state.tables[n]) for n in MAPS + SETS}
    state.state_root()  # before the tables fold: the root comes from the block's own writes
    assert state.tree is not None and state.tree.root is not None and parent.tree is not None
    db: Any = parent.tables["accounts"].root.backend  # type: ignore[union-attr]
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


def _view(state: State, height: int, last_hash: bytes, seq: int, befores: dict[str, dict[Any, Any]],
          tree: Any) -> State:
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


# ---------------------------------------------------------------- the one-time rebuild of the tree's layout

class _Chunks:
    """LevelDB writes in batches of :data:`MIGRATE_BATCH` (not synced: the final switch is, after them)."""

    def __init__(self, db: Any) -> None:
        self.db, self.wb, self.n = db, db.write_batch(), 0

    def put(self, k: bytes, v: bytes) -> None:
        self.wb.put(k, v)
        self._count()

    def delete(self, k: bytes) -> None:
        self.wb.delete(k)
        self._count()

    def _count(self) -> None:
        self.n += 1
        if self.n % MIGRATE_BATCH == 0:
            self.wb.write()
            self.wb = self.db.write_batch()

    def close(self) -> None:
        self.wb.write()


def _clear(db: Any, prefixes: list[bytes]) -> None:
    out = _Chunks(db)
    for prefix in prefixes:
        for k in db.iterator(prefix=prefix, include_value=False):
            out.delete(k)
    out.close()


def migrate_tree(db: Any) -> bool:
    """Rebuild the state tree of a store written in the binary node layout (no :data:`tr.LAYOUT_KEY`) in the
    16-ary layout (:mod:`node.ledger.core.jmt`), once; :func:`open_state` calls it. Returns whether it rebuilt.

    It rebuilds the versions the store reads: the head state's root and, when there is an undo record, its
    parent's (older versions are not kept). The leaves come from the stored entries (the parent's: the entries
    with the undo record's values put back), sorted by LevelDB under :data:`SCRATCH`; the parent's tree is then
    streamed out bottom-up (:func:`node.ledger.core.jmt.build_sorted`) and the head block's changes applied to it
    as one update, so the head's nodes and stale index are exactly what committing the block would have written.
    Both roots are checked against the stored ones. Memory: one block's undo record and :data:`MIGRATE_BATCH`
    writes at a time. Time: O(n log n) in LevelDB, about a minute per 10^6 entries.

    Crash-safe: nothing the binary layout uses is touched until the synced write of the layout key, after every
    new node is written; a crash before it leaves the old layout whole and the next open starts over (clearing
    what the interrupted attempt wrote); after it, the old nodes are deleted, and a crash midway leaves the rest
    for the next open to delete.

    Raises:
        StateFormatError: the stored entries do not give the stored roots (a damaged store).
    """
    if db.get(tr.LAYOUT_KEY) == tr.LAYOUT:
        if any(True for _ in db.iterator(prefix=tr.OLD_NODES, include_value=False)) or \
                any(True for _ in db.iterator(prefix=SCRATCH, include_value=False)):
            _clear(db, [tr.OLD_NODES, tr.OLD_STALE, SCRATCH])  # an interrupted cleanup's leftovers
        return False
    meta = read_meta(db)
    if meta is None:
        return False  # no state stored: dump_state writes the layout with the first one
    log.warning("ledger state: rebuilding the state tree in the 16-ary node layout (once; ~1 min per 10^6 entries)")
    _height, _last, seq, _counts, root = meta
    _clear(db, [tr.NODES, tr.STALE, SCRATCH])  # what an interrupted attempt wrote
    befores: dict[bytes, bytes | None] = {}  # tree key -> the parent state's leaf value (None: absent)
    parent: Root | None = None
    raw = db.get(UNDO)
    if raw is not None:
        _ph, _plast, pseq, undo, proot = unpack_local(raw)
        for name, rows in undo.items():
            if name not in CODECS:
                raise StateFormatError(f"the undo record names an unknown table {name!r}")
            codec = CODECS[name]
            for k, v in rows:
                befores[tr.entry_key(name, bytes(k))] = \
                    None if v is None else tr.leaf_value(codec.dumps(codec.decode_local(v)))
        befores[tr.SEQ_KEY] = tr.leaf_value(pack(pseq))
        parent = Root.from_bytes(proot)
    out = _Chunks(db)
    for name in MAPS + SETS:
        p = PREFIX[name]
        for k, v in db.iterator(prefix=p):
            out.put(SCRATCH + tr.entry_key(name, k[len(p):]), tr.leaf_value(v))
    out.put(SCRATCH + tr.SEQ_KEY, tr.leaf_value(pack(seq)))
    for tk, lv in befores.items():  # after the head's entries: the parent's values win
        if lv is None:
            out.delete(SCRATCH + tk)
        else:
            out.put(SCRATCH + tk, lv)
    out.close()
    base = parent if parent is not None else root
    out = _Chunks(db)
    leaves = ((k[len(SCRATCH):], v) for k, v in db.iterator(prefix=SCRATCH))
    built = jmt.build_sorted(leaves, base.version, lambda nk, v: out.put(tr.NODES + nk, v))
    out.close()
    if built.hash != base.hash:
        raise StateFormatError("the stored entries do not give the stored state root (a damaged store)")
    if parent is not None and parent != root:
        changes: dict[bytes, bytes | None] = {tr.SEQ_KEY: tr.leaf_value(pack(seq))}
        for name, rows in undo.items():
            for k, _v in rows:
                now = db.get(PREFIX[name] + bytes(k))
                changes[tr.entry_key(name, bytes(k))] = None if now is None else tr.leaf_value(now)
        res = jmt.update(tr.LevelNodes(db, tr.NodeCache()), root.version, parent, changes)
        if res.root != root:
            raise StateFormatError("the stored entries do not give the stored state root (a damaged store)")
        out = _Chunks(db)
        for nk, v in res.writes.items():
            out.put(tr.NODES + nk, v)
        for s in res.stale:
            out.put(tr.STALE + s.index_key(), b"")
        out.close()
    with db.write_batch(sync=True) as wb:  # the switch
        wb.put(tr.LAYOUT_KEY, tr.LAYOUT)
    _clear(db, [tr.OLD_NODES, tr.OLD_STALE, SCRATCH])
    db.compact_range(start=b"T/", stop=b"T0")  # drop the deleted nodes' tombstones now, not during blocks
    log.warning("ledger state: the state tree is in the 16-ary layout (root %s)", root.hash.hex()[:16])
    return True
