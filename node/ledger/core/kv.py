"""Copy-on-write tables for the ledger state: flat keys, reads in one lookup, no whole-state copy.

A :class:`Table` is a mutable mapping with the interface of the ``dict`` it replaces. It is a stack of layers:
zero or more overlays (each a dict of writes and deletions) on top of one root. :meth:`Table.child` pushes an
empty overlay: that is how :meth:`node.ledger.core.state.State.copy` makes the working copy a block is applied to,
in O(1) instead of copying every account and receipt. Two kinds of root:

* :class:`DictRoot` — decoded values in a dict (tests, genesis, ``node ledger verify``'s replay). A stack that
  grows past :data:`MAX_DEPTH` overlays is squashed into a new root (O(n) once per ``MAX_DEPTH`` copies).
* :class:`StoreRoot` — values msgpack-encoded under ``prefix + key`` in a key-value backend (LevelDB), with a
  bounded LRU cache of decoded values. :meth:`Table.stage` writes the overlays' changes into the same ``WriteBatch``
  as their block, :meth:`Table.settle` folds them into the root once it is written; the state the block was
  applied to stays readable as it was (it becomes an undo overlay over the new root).

Iteration is in sorted key order in every layout (a proposer and a validator that reached the same state by
different stacks iterate it identically; consensus depends on that). An :class:`OrderedSet` keeps insertion
order instead, with a sequence number per member drawn from a counter in the state.

Complexity: a read is O(depth) dict lookups then one cache or backend lookup; a write is one dict store (and one
read, for the counts); a commit is O(changes); iteration is O(n log n) (a backend prefix scan merged with the overlays).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Generic, Protocol, TypeVar

from ...encoding import pack, unpack, unpack_local

K = TypeVar("K")
V = TypeVar("V")

MAX_DEPTH = 8  # overlays on a DictRoot before a squash
CACHE_ITEMS = 65536  # decoded values kept per StoreRoot table

_DEL: Any = object()  # a deletion in an overlay


class Backend(Protocol):
    """Read side of the committed key-value store (a ``plyvel.DB`` fits)."""

    def get(self, key: bytes) -> bytes | None: ...

    def iterator(self, *, prefix: bytes, include_value: bool = True) -> Any: ...


class Batch(Protocol):
    """Write side: a ``plyvel`` ``WriteBatch`` fits."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...


class Codec(Generic[V]):
    """How a table's values become bytes: ``encode(value) -> msgpack-able``, ``decode(plain) -> value``;
    ``decode_local(plain)``, if given, decodes what this node stored itself (it may skip checks that ``decode``
    makes on values from outside)."""

    def __init__(self, encode: Callable[[V], Any], decode: Callable[[Any], V],
                 decode_local: Callable[[Any], V] | None = None):
        self.encode, self.decode = encode, decode
        self.decode_local = decode_local or decode

    def dumps(self, v: V) -> bytes:
        return pack(self.encode(v))

    def loads(self, raw: bytes) -> V:
        """Decode bytes from outside this node (a proof's leaf): through :func:`node.encoding.unpack`'s limits."""
        return self.decode(unpack(raw))

    def loads_local(self, raw: bytes) -> V:
        """Decode bytes this node stored itself (its LevelDB): :func:`node.encoding.unpack_local`, no scan."""
        return self.decode_local(unpack_local(raw))


class DictRoot(Generic[K, V]):
    """A root of decoded values held in memory."""

    def __init__(self, values: dict[K, V] | None = None):
        self.values: dict[K, V] = dict(values or {})

    @property
    def count(self) -> int:
        return len(self.values)

    def get(self, k: K) -> Any:
        return self.values.get(k, _DEL)

    def keys(self) -> Iterator[K]:
        return iter(self.values)


class StoreRoot(Generic[V]):
    """A root of encoded values under ``prefix + key`` in ``backend`` (keys are bytes), with an LRU cache."""

    def __init__(self, backend: Backend, prefix: bytes, codec: Codec[V], cache_items: int = CACHE_ITEMS,
                 count: int | None = None):
        self.backend, self.prefix, self.codec, self.cache_items = backend, prefix, codec, cache_items
        self._cache: OrderedDict[bytes, Any] = OrderedDict()
        self.count = sum(1 for _ in self.keys()) if count is None else count  # entries stored

    def get(self, k: object) -> Any:
        if not isinstance(k, bytes):  # a dict would say "absent" too (keys here are bytes)
            return _DEL
        v = self._cache.get(k, None)
        if v is not None:
            self._cache.move_to_end(k)
            return v
        if not self.count:  # nothing stored (an unused table: disputes, jobs, runs, ...): no LevelDB read
            return _DEL
        raw = self.backend.get(self.prefix + k)
        v = _DEL if raw is None else self.codec.loads_local(raw)
        self._remember(k, v)
        return v

    def _remember(self, k: Any, v: Any) -> None:
        self._cache[k] = v
        self._cache.move_to_end(k)
        while len(self._cache) > self.cache_items:
            self._cache.popitem(last=False)

    def keys(self) -> Iterator[Any]:  # bytes: a Table over a StoreRoot has K = bytes
        n = len(self.prefix)
        with self.backend.iterator(prefix=self.prefix, include_value=False) as it:
            return iter([k[n:] for k in it])


class Table(MutableMapping[K, V]):
    """A mapping over a stack of overlays and one root (see the module docstring).

    Raises:
        KeyError: reading or deleting a missing key with ``[]`` / ``del`` (as a dict does).
    """

    def __init__(self, root: DictRoot[K, V] | StoreRoot[V], parent: Table[K, V] | None = None):
        self.root = root
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.writes: dict[K, Any] = {}
        self.delta = 0  # entries added minus entries removed by this overlay

    @classmethod
    def memory(cls, values: dict[K, V] | None = None) -> Table[K, V]:
        """A table over a fresh in-memory root holding ``values``."""
        return cls(DictRoot(values))

    def child(self) -> Table[K, V]:
        """A copy-on-write child: writes to it leave this table unchanged."""
        if isinstance(self.root, DictRoot) and self.depth >= MAX_DEPTH:
            return Table(DictRoot(dict(self.items())))
        return Table(self.root, self)

    def _lookup(self, k: K) -> Any:
        t: Table[K, V] | None = self
        while t is not None:
            v = t.writes.get(k, t)
            if v is not t:
                return v
            t = t.parent
        return self.root.get(k)

    def __getitem__(self, k: K) -> V:
        v = self._lookup(k)
        if v is _DEL:
            raise KeyError(k)
        out: V = v
        return out

    def get(self, k: K, default: Any = None) -> Any:
        v = self._lookup(k)
        return default if v is _DEL else v

    def __contains__(self, k: object) -> bool:
        return self._lookup(k) is not _DEL  # type: ignore[arg-type]

    def __setitem__(self, k: K, v: V) -> None:
        if self._lookup(k) is _DEL:
            self.delta += 1
        self.writes[k] = v

    def __delitem__(self, k: K) -> None:
        if self._lookup(k) is _DEL:
            raise KeyError(k)
        self.writes[k] = _DEL
        self.delta -= 1

    def pop(self, k: K, *default: Any) -> Any:
        v = self._lookup(k)
        if v is _DEL:
            if default:
                return default[0]
            raise KeyError(k)
        self.writes[k] = _DEL
        self.delta -= 1
        return v

    def changes(self) -> dict[K, Any]:
        """Every key written in the overlays above the root, top-most write winning (``_DEL``: deleted)."""
        out: dict[K, Any] = {}
        t: Table[K, V] | None = self
        while t is not None:
            for k, v in t.writes.items():
                out.setdefault(k, v)
            t = t.parent
        return out

    def _bottom(self) -> Table[K, V]:
        t = self
        while t.parent is not None:
            t = t.parent
        return t

    def __iter__(self) -> Iterator[K]:
        ch = self.changes()
        keys = {k for k in self.root.keys() if k not in ch}  # noqa: SIM118  (a root is no dict: no __iter__)
        keys.update(k for k, v in ch.items() if v is not _DEL)
        return iter(sorted(keys))  # type: ignore[type-var]

    def pairs(self) -> list[tuple[K, V]]:
        """Every ``(key, value)``, in sorted key order: exactly ``list(self.items())``, in one pass over the root
        (for a :class:`StoreRoot`, one LevelDB scan with values; values it has decoded are taken from its cache)
        instead of a lookup through every overlay per key. O(n log n)."""
        ch = self.changes()
        root = self.root
        out: list[tuple[Any, Any]]
        if isinstance(root, StoreRoot):
            n, cache, loads = len(root.prefix), root._cache, root.codec.loads_local
            out = []
            if root.count:
                with root.backend.iterator(prefix=root.prefix) as it:
                    for rk, raw in it:
                        k = rk[n:]
                        if k not in ch:
                            v = cache.get(k)  # (absent, or _DEL cached by a miss before this key was written)
                            out.append((k, loads(raw) if v is None or v is _DEL else v))
        else:
            vals = root.values
            out = [(k, vals[k]) for k in vals if k not in ch]
        out.extend((k, v) for k, v in ch.items() if v is not _DEL)
        out.sort(key=lambda kv: kv[0])
        return out

    def __len__(self) -> int:
        """O(depth): the root's count plus every overlay's delta."""
        n, t = self.root.count, self
        while True:
            n += t.delta
            if t.parent is None:
                return n
            t = t.parent

    def stage(self, batch: Batch | None, encoded: dict[K, bytes] | None = None) -> dict[K, Any]:
        """First half of a commit: write this table's changes (its overlays down to the root) into ``batch``
        (a StoreRoot; None for a DictRoot) and turn the bottom table of the stack — the previous state's —
        into an exact view of that previous state (an undo overlay: the root's values before, for the keys
        that change). Nothing this table or any other reads changes yet; call :meth:`settle` once ``batch``
        is written.

        ``encoded``: stored bytes already made for some of the changed values (key -> bytes of the value this
        table holds now: :attr:`node.ledger.core.state.State.encoded`); the others are encoded here.

        Returns ``{key: the root's value before}`` (``_DEL`` where absent) for the keys that change.

        Raises:
            ValueError: ``batch`` is None for a StoreRoot, or this table has no overlays to commit.
        """
        self._staged_len = len(self)
        if self.parent is None and not self.writes:
            self._staged: dict[K, Any] | None = {}
            return {}
        ch = self.changes()
        before = {k: self.root.get(k) for k in ch}
        if isinstance(self.root, StoreRoot):
            if batch is None:
                raise ValueError("a store-backed table commits into a write batch")
            enc = encoded or {}
            for k, v in ch.items():
                key = self.root.prefix + k  # type: ignore[operator]
                if v is _DEL:
                    batch.delete(key)
                else:
                    raw = enc.get(k)
                    batch.put(key, raw if raw is not None else self.root.codec.dumps(v))
        bottom = self._bottom()
        self._undo_of: tuple[Table[K, V], int] | None = None
        if bottom is not self:  # the state this one was built on stays readable, as it was
            undo = {k: v for k, v in before.items() if k not in bottom.writes}
            self._undo_of = (bottom, sum(1 for v in undo.values() if v is not _DEL) - sum(
                1 for k in undo if ch[k] is not _DEL))  # its count against the new root (settle applies it)
            bottom.writes = {**undo, **bottom.writes}  # one assignment: a reader sees the old or the new dict
        self._staged = ch
        return before

    def settle(self) -> None:
        """Second half of a commit (after the batch of :meth:`stage` is written): the root takes the new
        values, and this table reads the root directly."""
        ch = getattr(self, "_staged", None)
        if ch is None:
            raise ValueError("settle() without stage()")
        self._staged = None
        n = self._staged_len
        if isinstance(self.root, StoreRoot):
            for k, v in ch.items():
                self.root._remember(k, v)
            self.root.count = n
        else:
            vals = self.root.values
            for k, v in ch.items():
                if v is _DEL:
                    vals.pop(k, None)
                else:
                    vals[k] = v
        self.parent, self.depth, self.writes, self.delta = None, 0, {}, 0
        if self._undo_of is not None:  # the previous state now reads through this one (never a cycle: this
            bottom, d = self._undo_of  # table has no parent any more), so it stays exact after later commits
            bottom.parent, bottom.depth = self, 1
            bottom.delta += d

    def undo_view(self, before: dict[K, Any]) -> Table[K, V]:
        """A read view of this table with the values in ``before`` instead (``_DEL``: absent): the previous
        state, rebuilt from a stored undo record. It stays exact after later commits (it reads through this
        table, which :meth:`stage` turns into a view of itself)."""
        t: Table[K, V] = Table(self.root, self)
        t.writes = dict(before)
        t.delta = sum(1 for v in before.values() if v is not _DEL) - sum(
            1 for k in before if self._lookup(k) is not _DEL)
        return t


class OrderedSet(Generic[K]):
    """A set that iterates in insertion order (a ``dict`` of ``None`` values as the state used): a
    :class:`Table` from member to its sequence number. Re-adding a member keeps its place; removing and adding
    it again moves it to the end, exactly as with a dict.

    Args:
        table: member -> sequence number.
        counter: ``counter()`` returns the next sequence number (the state's, so every node draws the same).
    """

    def __init__(self, table: Table[K, int], counter: Callable[[], int]):
        self.table, self.counter = table, counter

    def __contains__(self, k: object) -> bool:
        return k in self.table

    def __setitem__(self, k: K, _none: None) -> None:
        if k not in self.table:
            self.table[k] = self.counter()

    def pop(self, k: K, default: Any = None) -> Any:
        if k in self.table:
            self.table.pop(k)
            return None
        return default

    def __iter__(self) -> Iterator[K]:
        return iter([k for _, k in sorted([(s, k) for k, s in self.table.pairs()])])

    def __len__(self) -> int:
        return len(self.table)

    def __bool__(self) -> bool:
        return len(self.table) > 0
