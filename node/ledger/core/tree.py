"""The state root: the sparse Merkle tree (:mod:`node.ledger.core.smt`) over every entry of the ledger state.

Its nodes are stored in the 16-ary (Jellyfish) layout of :mod:`node.ledger.core.jmt` (the same roots and proofs
as the binary tree, ~log16 n stored nodes per key): layout :data:`LAYOUT`, recorded under :data:`LAYOUT_KEY`. A
store written before (binary nodes under ``T/n/``, ``T/x/``, no layout key) is rebuilt once when it is opened
(:func:`node.ledger.statedb.migrate_tree`).

Each entry ``key -> value`` of table ``t`` is the tree leaf ``tree_key(TAG[t], key) -> H(value bytes)``, the
value bytes being exactly what the store writes (:data:`node.ledger.statedb.CODECS`); the open sets' counter
is the leaf ``tree_key(b"meta", b"seq")``. The root after block ``h`` is version ``h`` of the tree, so
:meth:`node.ledger.core.state.State.state_root` costs O(changes · log n) per block, whatever the state's size, and
any retained version proves any entry (:func:`prove_entry`, checked by :func:`node.ledger.proofs.
verify_entry_proof`).

Where the nodes live (a :class:`StateTree` per state):

* a state committed by the store reads the LevelDB nodes under ``T/`` (its block's node writes go into the
  block's ``WriteBatch``; nodes stale for :data:`RETAIN` versions are deleted then);
* a state built on another keeps its own node writes in memory until committed, reading through its parent's;
  a chain of such states (a replay in memory) folds a parent's writes into one shared in-memory store as soon as
  a child is built on it and no sibling at that height did so first (so chains stay shallow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from hashlib import blake2b
from typing import Any

from .jmt import prove, update
from .modules import STORE_KEYS
from .smtnode import EMPTY_ROOT, Root, StaleNode, UpdateResult, prune_bound, tree_key

TAG = STORE_KEYS  # table -> the tag hashed into its entries' tree keys: its module's store key (core.modules)
SEQ_KEY = tree_key(b"meta", b"seq")
NODES = b"T/N/"  # + jmt node key -> node bytes
STALE = b"T/X/"  # + StaleNode.index_key() -> b""
LAYOUT_KEY = b"T/v"  # -> LAYOUT: how the nodes are stored (absent: the binary layout of stores written before)
LAYOUT = b"jmt16"
OLD_NODES = b"T/n/"  # the binary layout's nodes (smt node keys) and stale index, read only by the migration
OLD_STALE = b"T/x/"
RETAIN = 1024  # versions (blocks) whose roots stay provable


_KEY_PREFIX = {t: bytes([len(tag)]) + tag for t, tag in TAG.items()}  # tree_key's hashed prefix, per table
_LEAF_TAG = b"tally/state-entry/v1"
# the same prefixes already absorbed into a hash state: copy() and update() the rest (one concatenation and one
# hash object's setup less per changed entry)
_KEY_STATE = {t: blake2b(prefix, digest_size=32) for t, prefix in _KEY_PREFIX.items()}
_LEAF_STATE = blake2b(_LEAF_TAG, digest_size=32)


def entry_key(table: str, key: bytes) -> bytes:
    """The tree key of ``key`` in state table ``table`` (32 bytes): :func:`node.ledger.core.smtnode.tree_key` of the
    table's tag, computed with one hash call (once per changed entry per block).

    Raises: KeyError for an unknown table; TypeError for a key that is not bytes."""
    if not isinstance(key, bytes):
        raise TypeError("tag and raw key must be bytes")
    h = _KEY_STATE[table].copy()
    h.update(key)
    return h.digest()


def leaf_value(raw: bytes) -> bytes:
    """What a leaf holds for a stored value: its 32-byte hash (the tree never duplicates the records):
    ``H("tally/state-entry/v1" ‖ raw)``."""
    h = _LEAF_STATE.copy()
    h.update(raw)
    return h.digest()


class _Shared:
    """Node bytes by node key, in memory, and which versions were folded in (one lineage per version)."""

    def __init__(self) -> None:
        self.nodes: dict[bytes, bytes] = {}
        self.versions: set[int] = set()
        self.stale: dict[int, list[bytes]] = {}  # version -> node keys no version >= it uses

    def get(self, node_key: bytes) -> bytes | None:
        return self.nodes.get(node_key)


CACHE_NODES = 1 << 16  # nodes per generation of a NodeCache (two generations: at most twice this many held)


class NodeCache:
    """Committed tree nodes in memory, by node key: the node writes of the blocks this node committed and the
    nodes it read from LevelDB, shared by the trees of successive committed states.

    Every block rewrites the top of the tree and reads the rest of every changed path, so most of the next
    block's reads are of nodes just written or just read: from here in a dict lookup instead of a LevelDB read
    each. Node keys begin with the version that wrote them and a version is written once, so a node held here is
    always the stored one; :func:`stage` drops the nodes it prunes.

    Bounded: two generations of at most ``limit`` nodes each (an approximate LRU, O(1) per operation: a hit in
    the older generation moves to the newer; when the newer one holds ``limit`` nodes it becomes the older and
    the older is forgotten). Memory: about 250 bytes (a leaf) to 800 bytes (a full 16-ary node) per node held
    (key, node bytes, dict slot): at most ~100 MiB with the default :data:`CACHE_NODES`, ~30 MiB in practice (the
    leaves and sparse lower nodes dominate).
    """

    def __init__(self, limit: int = CACHE_NODES) -> None:
        self.limit = limit
        self.hot: dict[bytes, bytes] = {}
        self.cold: dict[bytes, bytes] = {}

    def __len__(self) -> int:
        return len(self.hot) + len(self.cold)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(node key, node bytes)`` held (a node may appear in both generations, with the same bytes)."""
        yield from self.hot.items()
        yield from self.cold.items()

    def get(self, node_key: bytes) -> bytes | None:
        raw = self.hot.get(node_key)
        if raw is None:
            raw = self.cold.get(node_key)
            if raw is not None:
                self.put(node_key, raw)
        return raw

    def put(self, node_key: bytes, raw: bytes) -> None:
        """Hold ``raw``, the committed node under ``node_key``, in the newer generation."""
        hot = self.hot
        hot[node_key] = raw
        if len(hot) >= self.limit:
            self.cold, self.hot = hot, {}

    def add(self, writes: dict[bytes, bytes]) -> None:
        """Hold ``writes`` (node key -> bytes), committed just now (all of them, or none when they are more than
        ``limit``: a whole tree written at once)."""
        if 0 < len(writes) <= self.limit:
            self.hot.update(writes)
            if len(self.hot) >= self.limit:
                self.cold, self.hot = self.hot, {}

    def drop(self, node_key: bytes) -> None:
        """Forget ``node_key`` (its node is being deleted)."""
        self.hot.pop(node_key, None)
        self.cold.pop(node_key, None)


class LevelNodes:
    """The committed tree's nodes in LevelDB (a :class:`node.ledger.core.smtnode.NodeStore`), through a
    :class:`NodeCache` (shared by the trees of successive committed states)."""

    def __init__(self, db: Any, cache: NodeCache | None = None):
        self.db = db
        self.cache = cache if cache is not None else NodeCache()

    def get(self, node_key: bytes) -> bytes | None:
        c = self.cache
        raw: bytes | None = c.hot.get(node_key)
        if raw is None:
            raw = c.cold.get(node_key)
            if raw is None:
                raw = self.db.get(NODES + node_key)
                if raw is None:
                    return None
            c.put(node_key, raw)
        return raw


class StateTree:
    """The tree of one state: its root once computed, its pending node writes, where to read the rest.

    Args:
        parent: the tree of the state this one was built on (None: ``root`` is committed in ``base``).
        base: where committed or folded nodes are read.
        root: the root when already known (a committed state), else None until :meth:`compute`.
    """

    def __init__(self, parent: StateTree | None, base: Any, root: Root | None = None):
        self.parent, self.base, self.root = parent, base, root
        self.pending: dict[bytes, bytes] = {}
        self.stale: tuple[StaleNode, ...] = ()

    def get(self, node_key: bytes) -> bytes | None:
        t: StateTree | None = self
        while t is not None:
            v = t.pending.get(node_key)
            if v is not None:
                return v
            t = t.parent
        raw: bytes | None = self.base.get(node_key)
        return raw

    def child(self) -> StateTree:
        """The tree of a state built on this one (whose root is then needed: it is computed here)."""
        if self.root is None:
            raise ValueError("the parent's root is computed first (State.state_root)")
        self._fold()
        return StateTree(self if self.pending else None, self.base)

    def _fold(self) -> None:
        # a replay in memory: move this state's nodes into the shared store, once per version
        if self.pending and isinstance(self.base, _Shared) and self.root is not None \
                and self.root.version not in self.base.versions and self.parent is None:
            self.base.nodes.update(self.pending)
            v = self.root.version
            self.base.versions.add(v)
            self.base.stale.setdefault(v, []).extend(x.node_key for x in self.stale)
            self.pending = {}
            # a replay in memory reads this version and the next only: drop the nodes only older ones used
            for since in [x for x in self.base.stale if x <= v - 1]:
                for nk in self.base.stale.pop(since):
                    self.base.nodes.pop(nk, None)

    def compute(self, parent_root: Root, version: int, changes: dict[bytes, bytes | None]) -> Root:
        """Apply ``changes`` (tree key -> leaf value or None) to ``parent_root`` as ``version``; remember the
        root and the node writes. Raises as :func:`node.ledger.core.jmt.update`."""
        if not changes:
            self.root = parent_root
            return parent_root
        # a tree with nothing pending above its base reads the base directly (one call less per node read)
        reader = self.base if self.parent is None and not self.pending else self
        res: UpdateResult = update(reader, version, parent_root, changes)
        self.pending, self.stale, self.root = dict(res.writes), res.stale, res.root
        return res.root

    def prove(self, key: bytes) -> Any:
        """:func:`node.ledger.core.jmt.prove` of ``key`` under this state's root (a binary
        :class:`node.ledger.core.smt.Proof`)."""
        if self.root is None:
            raise ValueError("the root is not computed yet")
        return prove(self, self.root, key)


def memory_tree() -> StateTree:
    """The tree of a state with no parent, in memory (genesis; ``compute`` it from every entry)."""
    return StateTree(None, _Shared())


def stage(batch: Any, tree: StateTree, height: int, prune_stale: Callable[[bytes], Iterator[bytes]]) -> None:
    """Write ``tree``'s pending nodes and stale index into ``batch`` and delete the nodes stale for more than
    :data:`RETAIN` versions. ``prune_stale(bound)`` yields the stale index keys below ``bound``."""
    for k, v in tree.pending.items():
        batch.put(NODES + k, v)
    since, prefix = -1, b""
    for s in tree.stale:  # STALE + s.index_key(), the version's bytes made once per version
        if s.since != since:
            since, prefix = s.since, STALE + s.since.to_bytes(8, "big")
        batch.put(prefix + s.node_key, b"")
    cache = tree.base.cache if isinstance(tree.base, LevelNodes) else None
    if height > RETAIN:
        for ik in prune_stale(STALE + prune_bound(height - RETAIN)):
            batch.delete(ik)
            nk = StaleNode.from_index_key(ik[len(STALE):]).node_key
            batch.delete(NODES + nk)
            if cache is not None:
                cache.drop(nk)


def settled(db: Any, root: Root, after: StateTree | None = None) -> StateTree:
    """The tree of the committed state whose root is ``root``. ``after``: the tree whose pending writes were
    just committed as ``root`` (their nodes, and the ones its base held, stay in memory: :class:`NodeCache`)."""
    cache = None
    if after is not None and isinstance(after.base, LevelNodes):
        cache = after.base.cache
        cache.add(after.pending)
    return StateTree(None, LevelNodes(db, cache), root)


__all__ = [
    "CACHE_NODES",
    "EMPTY_ROOT",
    "LAYOUT",
    "LAYOUT_KEY",
    "RETAIN",
    "SEQ_KEY",
    "TAG",
    "LevelNodes",
    "NodeCache",
    "StateTree",
    "entry_key",
    "leaf_value",
    "memory_tree",
    "settled",
    "stage",
]
