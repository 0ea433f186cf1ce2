"""The state tree stored as a 16-ary (Jellyfish) tree: the binary sparse Merkle tree of :mod:`.smt`, same hashes.

The map, its hashes, its roots and its proofs are exactly those of :mod:`node.ledger.core.smt` (byte for byte:
``tests/ledger/test_jmt.py`` checks it against that module on random histories); only the way nodes are stored
differs. The layout is Aptos' Jellyfish Merkle tree (aptos-core ``storage/jellyfish-merkle/src/node_type/mod.rs``:
``InternalNode`` holds up to 16 children by nibble and ``InternalNode::merkle_hash`` hashes them as a 4-level
binary subtree; Gao et al., "Jellyfish Merkle Tree", Diem, 2021):

* A stored *internal node* at nibble depth ``j`` (path length ``j`` nibbles, binary depth ``4j``) stands for the
  binary subtree of depths ``4j .. 4j + 4``. It exists exactly where the binary subtree at depth ``4j`` holds at
  least two leaves. It records each of its 16 child slots (by the key's nibble ``j``) as empty, a leaf or an
  internal node, with the child's ``(hash, version)``. Its hash is the binary hash of those 16 slots
  (:mod:`node.ledger.core.jmtnode`: two empties make an empty, an empty beside a leaf lifts the leaf, anything
  else is ``H(0x01 ‖ left ‖ right)``), the binary tree's compression rule, so it equals the binary node's hash.
* A *leaf* sits in the slot of its key's nibble under the deepest internal node on its path (at the root when
  the map holds one entry); its bytes and hash are the binary tree's (``0x00 ‖ key ‖ value``).
* Node keys are ``version ‖ nibble depth ‖ nibble path``, node bytes a bitmap and ``(hash, version)`` per child
  (:mod:`node.ledger.core.jmtnode`). A changed key rewrites about ``log16 n`` nodes (5 at 10^6 entries, against
  ~20 binary ones), and the nodes one update writes share its version prefix, so they are adjacent in LevelDB.

Versioning, stale nodes and exact pruning work as in :mod:`.smt`: every write goes to a fresh key of the new
version, and a replaced node is recorded stale since that version (:class:`node.ledger.core.smtnode.StaleNode`).

Complexity: :func:`update` with ``c`` changes reads and writes O(c · log16 n) nodes, each read node checked
against its parent's hash (at most 15 hashes; the upper 4 levels, which every block reads, are kept decoded with
their binary levels) and each rewritten one rehashed above its changed slots (4 hashes per slot); :func:`get` and
:func:`prove` read O(log16 n) nodes; proofs are the binary :class:`node.ledger.core.smt.Proof` and verify with
:func:`node.ledger.core.smt.verify`, which needs no store. Pure, like :mod:`.smt`: storage arrives through a
:class:`node.ledger.core.smtnode.NodeStore` and writes go back to the caller.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ...encoding import H
from .jmtnode import (
    _CHILD,
    _E,
    _EMPTY16,
    _HEADER,
    _I,
    _L,
    _ZERO_VERSION,
    CACHED_DEPTH,
    NIBBLES,
    _encode,
    _full,
    _leaf_of,
    _Levels,
    _missing,
    _rehash,
    _remember,
    _slot_path,
    _suffix,
    _verified,
    node_key,
)
from .smt import Proof, checked_changes, merge_leaf
from .smtnode import (
    DEPTH,
    EMPTY_HASH,
    EMPTY_ROOT,
    KEY_LEN,
    CorruptNodeError,
    NodeStore,
    Root,
    StaleNode,
    UpdateResult,
    leaf_hash,
)

# ---------------------------------------------------------------- update

class _Leaf:
    """A leaf to place in a slot; ``old`` is its stored node (nibble depth, node key, hash, version bytes) when
    its key and value are unchanged, so that it is not rewritten if it stays in the same slot."""

    __slots__ = ("key", "kint", "old", "value")

    def __init__(self, kint: int, key: bytes, value: bytes, old: tuple[int, bytes, bytes, bytes] | None = None):
        self.kint, self.key, self.value, self.old = kint, key, value, old


_Ref = tuple[bytes, bytes]  # an internal node, by (hash, version bytes)
_Result = _Leaf | _Ref | None


class _Ctx:
    def __init__(self, get: Callable[[bytes], bytes | None], vbytes: bytes, bulk: bool = False) -> None:
        self.get = get
        self.vbytes = vbytes
        self.bulk = bulk  # a whole tree written at once: do not fill the decoded-node cache
        self.writes: dict[bytes, bytes] = {}
        self.stale: list[bytes] = []


def _place(ctx: _Ctx, j: int, r: _Leaf) -> tuple[bytes, bytes]:
    """``(hash, version bytes)`` of the leaf ``r`` placed at nibble depth ``j`` (written if new or moved)."""
    old = r.old
    if old is not None:
        if old[0] == j:
            return old[2], old[3]
        ctx.stale.append(old[1])
    ctx.writes[ctx.vbytes + _suffix(j, r.kint)] = b"\x00" + r.key + r.value
    return leaf_hash(r.key, r.value), ctx.vbytes


def _node(ctx: _Ctx, j: int, kint: int, hs: list[bytes], vs: list[bytes], ks: list[int],
          levels: _Levels | None = None, data: bytes | None = None) -> _Ref:
    """Write the internal node of slots ``hs, vs, ks`` (binary ``levels`` and its bytes ``data`` when already
    computed) at nibble depth ``j`` on the path of ``kint``; it is remembered decoded (the next block reads it)
    unless ``ctx.bulk``."""
    lh, lk = levels if levels is not None else _full(hs, ks)
    if data is None:
        data = _encode(hs, vs, ks)
    ctx.writes[ctx.vbytes + _suffix(j, kint)] = data
    if not ctx.bulk and j <= CACHED_DEPTH:
        _remember(data, (lh, lk))
    return lh[0][0], ctx.vbytes


def _build(ctx: _Ctx, j: int, items: list[_Leaf], kints: list[int], lo: int, hi: int) -> _Result:
    """The subtree at nibble depth ``j`` holding exactly ``items[lo:hi]`` (sorted by key), written bottom-up."""
    if hi - lo <= 1:
        return items[lo] if hi > lo else None
    hs, vs, ks = list(_EMPTY16), [_ZERO_VERSION] * 16, [_E] * 16
    shift = DEPTH - 4 * j - 4
    i = lo
    while i < hi:
        top = kints[i] >> shift
        e = bisect.bisect_left(kints, (top + 1) << shift, i, hi)
        s = top & 15
        r = _build(ctx, j + 1, items, kints, i, e)
        if isinstance(r, _Leaf):
            hs[s], vs[s] = _place(ctx, j + 1, r)
            ks[s] = _L
        elif r is not None:
            hs[s], vs[s] = r
            ks[s] = _I
        i = e
    return _node(ctx, j, kints[lo], hs, vs, ks)


def _build_new(ctx: _Ctx, j: int, ch: list[tuple[int, bytes, bytes | None]], lo: int, hi: int) -> _Result:
    items = [_Leaf(k, key, v) for k, key, v in ch[lo:hi] if v is not None]
    return _build(ctx, j, items, [x.kint for x in items], 0, len(items))


def _apply_leaf(ctx: _Ctx, data: bytes, h: bytes, vb: bytes, nk: bytes, j: int,
                ch: list[tuple[int, bytes, bytes | None]], lo: int, hi: int) -> _Result:
    """Apply the changes ``ch[lo:hi]`` to the stored leaf ``data`` (node key ``nk``) at nibble depth ``j``."""
    key, value = _leaf_of(data, h, vb, j, ch[lo][0])
    kept = _Leaf(int.from_bytes(key, "big"), key, value, (j, nk, h, vb))
    items, gone = merge_leaf(kept, ch, lo, hi, _Leaf)
    if gone:
        ctx.stale.append(nk)  # the leaf was deleted or given a new value
    return _build(ctx, j, items, [x.kint for x in items], 0, len(items))


def _apply(ctx: _Ctx, h: bytes, vb: bytes, j: int, ch: list[tuple[int, bytes, bytes | None]],
           kints: list[int], lo: int, hi: int) -> _Result:
    """Apply the changes ``ch[lo:hi]`` (sorted, non-empty) to the stored subtree ``(h, vb)`` at nibble depth
    ``j``: each stored node on the changed paths is read and checked once, and rewritten once if it changed."""
    kint = kints[lo]
    suffix = _suffix(j, kint)
    nk = vb + suffix
    data = ctx.get(nk)
    if data is None:
        raise _missing(vb, j)
    if data[:1] == b"\x00":
        return _apply_leaf(ctx, data, h, vb, nk, j, ch, lo, hi)
    vs, lh, lk = _verified(data, h, vb, j)  # new lists, changed below
    hs, ks = lh[4], lk[4]
    k4 = ks[:]  # the slot kinds as stored
    shift = DEPTH - 4 * j - 4
    placed: list[tuple[int, _Leaf]] = []
    dirty: list[int] = []
    i = lo
    while i < hi:
        top = kints[i] >> shift
        e = bisect.bisect_left(kints, (top + 1) << shift, i, hi)
        s = top & 15
        r = _build_new(ctx, j + 1, ch, i, e) if ks[s] == _E else _apply(ctx, hs[s], vs[s], j + 1, ch, kints, i, e)
        if r is None:
            if ks[s] != _E:
                hs[s], vs[s], ks[s] = EMPTY_HASH, _ZERO_VERSION, _E
                dirty.append(s)
        elif isinstance(r, _Leaf):
            placed.append((s, r))
            ks[s] = _L
        elif r[0] != hs[s] or r[1] != vs[s]:
            hs[s], vs[s], ks[s] = r[0], r[1], _I
            dirty.append(s)
        i = e
    # lift a lone leaf, drop an empty node
    if ks.count(_E) >= 15 and _I not in ks:
        ctx.stale.append(nk)
        if _L not in ks:
            return None
        s = ks.index(_L)
        if placed:
            return placed[0][1]
        pk = _slot_path(kint, j, s)
        lnk = vs[s] + _suffix(j + 1, pk)
        ldata = ctx.get(lnk)
        if ldata is None:
            raise _missing(vs[s], j + 1)
        lkey, lvalue = _leaf_of(ldata, hs[s], vs[s], j + 1, pk)
        return _Leaf(int.from_bytes(lkey, "big"), lkey, lvalue, (j + 1, lnk, hs[s], vs[s]))
    for s, leaf in placed:
        nh, nv = _place(ctx, j + 1, leaf)
        if nh != hs[s] or nv != vs[s]:
            hs[s], vs[s] = nh, nv
            dirty.append(s)
    if not dirty:
        return h, vb
    ctx.stale.append(nk)
    _rehash(lh, lk, dirty)
    for s in dirty:
        if k4[s] != ks[s]:
            return _node(ctx, j, kint, hs, vs, ks, (lh, lk))
    # the same slots present, of the same kinds: patch the changed children into the stored bytes
    buf = bytearray(data)
    full = _E not in k4
    for s in dirty:
        o = _HEADER + _CHILD * (s if full else s - k4[:s].count(_E))
        buf[o:o + _CHILD] = hs[s] + vs[s]
    return _node(ctx, j, kint, hs, vs, ks, (lh, lk), bytes(buf))


def _check_key(key: Any) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_LEN:
        raise ValueError(f"a tree key is {KEY_LEN} bytes (hash your key with tree_key)")


def _root_of(ctx: _Ctx, r: _Result, root: Root, version: int, empty: bool) -> Root:
    if r is None:
        return root if empty else Root(EMPTY_HASH, version)
    h, v = _place(ctx, 0, r) if isinstance(r, _Leaf) else r
    return Root(h, int.from_bytes(v, "big"))


def update(store: NodeStore, version: int, root: Root, changes: Mapping[bytes, bytes | None]) -> UpdateResult:
    """Apply ``changes`` (key -> new value, or None to delete; deleting an absent key is a no-op) to the tree
    ``root`` as version ``version``. Returns the new root, the node writes and the stale nodes; stores nothing.
    Same contract and same roots as :func:`node.ledger.core.smt.update`; the writes are 16-ary nodes.

    Cost: O(len(changes) · log16 n) node reads and writes, n the number of keys; all changes of one call are
    sorted and applied in one walk, so a node shared by several changed paths is read and written once.

    Raises:
        ValueError: a key that is not 32 bytes, a value that is not bytes or None, ``version`` not an int in
            ``[0, 2^64)``, or not greater than ``root.version`` (at least it, for an empty root).
        MissingNodeError, CorruptNodeError: ``root``'s nodes are not (intact) in ``store``.
    """
    ch, empty = checked_changes(root, version, changes)
    if not ch:
        return UpdateResult(root, {}, ())
    ctx = _Ctx(store.get, version.to_bytes(8, "big"))
    if empty:
        r = _build_new(ctx, 0, ch, 0, len(ch))
    else:
        r = _apply(ctx, root.hash, root.version.to_bytes(8, "big"), 0, ch, [c[0] for c in ch], 0, len(ch))
    new = _root_of(ctx, r, root, version, empty)
    if new.hash == root.hash and not empty:
        return UpdateResult(root, {}, ())  # nothing changed (every change was a no-op)
    mk = tuple.__new__  # StaleNode(version, nk) without the NamedTuple's Python-level __new__ (one per node)
    return UpdateResult(new, ctx.writes, tuple([mk(StaleNode, (version, nk)) for nk in ctx.stale]))


def build_sorted(leaves: Iterable[tuple[bytes, bytes]], version: int,
                 emit: Callable[[bytes, bytes], None]) -> Root:
    """Build the tree of ``leaves`` (``(key, value)``, keys strictly increasing) as version ``version`` in one
    streaming pass, calling ``emit(node key, node bytes)`` for each node (bottom-up). Memory: O(64 · 16) node
    slots whatever the number of leaves, for a one-time rebuild of a large store (the layout migration).
    The root equals :func:`update` of the same map onto :data:`node.ledger.core.smtnode.EMPTY_ROOT`.

    Raises: ValueError for keys that are not 32 bytes or not strictly increasing.
    """
    it = iter(leaves)
    vbytes = version.to_bytes(8, "big")
    ctx = _Ctx(lambda nk: None, vbytes, bulk=True)
    pending: list[_Leaf | None] = [None]
    last = [-1]

    def pull() -> _Leaf | None:
        nxt = next(it, None)
        if nxt is None:
            return None
        key, value = nxt
        _check_key(key)
        k = int.from_bytes(key, "big")
        if k <= last[0]:
            raise ValueError("leaves must be sorted by key, without repeats")
        last[0] = k
        return _Leaf(k, key, value)

    def flush() -> None:
        for nk, raw in ctx.writes.items():
            emit(nk, raw)
        ctx.writes.clear()

    def sub(j: int, first: _Leaf) -> _Result:
        nxt = pending[0]
        if nxt is None or (nxt.kint ^ first.kint) >> (DEPTH - 4 * j):
            return first  # alone below depth j
        hs, vs, ks = list(_EMPTY16), [_ZERO_VERSION] * 16, [_E] * 16
        shift = DEPTH - 4 * j - 4
        cur = first
        while True:
            s = (cur.kint >> shift) & 15
            r = sub(j + 1, cur)
            if isinstance(r, _Leaf):
                hs[s], vs[s] = _place(ctx, j + 1, r)
                ks[s] = _L
            else:
                assert r is not None
                hs[s], vs[s] = r
                ks[s] = _I
            nxt = pending[0]
            if nxt is None or (nxt.kint ^ first.kint) >> (DEPTH - 4 * j):
                break
            pending[0] = pull()
            cur = nxt
        ref = _node(ctx, j, first.kint, hs, vs, ks)
        if len(ctx.writes) >= 4096:
            flush()
        return ref

    first = pull()
    if first is None:
        return EMPTY_ROOT
    pending[0] = pull()
    r = sub(0, first)
    root = _root_of(ctx, r, EMPTY_ROOT, version, True)
    flush()
    return root


# ---------------------------------------------------------------- reads and proofs

def _walk(store: NodeStore, root: Root, key: bytes) -> tuple[list[bytes], tuple[bytes, bytes] | None]:
    """The binary siblings on ``key``'s path from the root down and the leaf ``(key, value)`` found at its end
    (None: an empty subtree), reading one stored node per nibble level."""
    _check_key(key)
    kint = int.from_bytes(key, "big")
    h, vb = root.hash, root.version.to_bytes(8, "big")
    siblings: list[bytes] = []
    get = store.get
    for j in range(NIBBLES + 1):
        if h == EMPTY_HASH:
            return siblings, None
        data = get(vb + _suffix(j, kint))
        if data is None:
            raise _missing(vb, j)
        if data[:1] == b"\x00":
            return siblings, _leaf_of(data, h, vb, j, kint)
        if j == NIBBLES:
            break
        vs, lh, lk = _verified(data, h, vb, j)
        hs, ks = lh[4], lk[4]
        nib = (kint >> (DEPTH - 4 * j - 4)) & 15
        for t in range(1, 5):
            idx = nib >> (4 - t)
            siblings.append(lh[t][idx ^ 1])
            kind = lk[t][idx]
            if kind == _E:
                return siblings, None
            if kind == _L:  # the range's lone leaf: the binary path ends here
                width = 1 << (4 - t)
                s = next(x for x in range(idx * width, (idx + 1) * width) if ks[x] != _E)
                pk = _slot_path(kint, j, s)
                ldata = get(vs[s] + _suffix(j + 1, pk))
                if ldata is None:
                    raise _missing(vs[s], j + 1)
                return siblings, _leaf_of(ldata, hs[s], vs[s], j + 1, pk)
        h, vb = hs[nib], vs[nib]
    raise CorruptNodeError("tree path longer than 256")


def get(store: NodeStore, root: Root, key: bytes) -> bytes | None:
    """The value of ``key`` in the tree ``root``, or None. Every node read is checked against its hash.

    Raises: ValueError for a key that is not 32 bytes; MissingNodeError, CorruptNodeError as :func:`update`.
    """
    leaf = _walk(store, root, key)[1]
    return leaf[1] if leaf is not None and leaf[0] == key else None


def prove(store: NodeStore, root: Root, key: bytes) -> Proof:
    """A binary proof (:class:`node.ledger.core.smt.Proof`, the same bytes as :func:`node.ledger.core.smt.prove`
    gives for the same map) of ``key``'s value in ``root``, or of its absence.

    Raises: ValueError for a key that is not 32 bytes; MissingNodeError, CorruptNodeError as :func:`update`.
    """
    siblings, leaf = _walk(store, root, key)
    return Proof(tuple(siblings), None if leaf is None else (leaf[0], H(leaf[1])))


def leaves(store: NodeStore, root: Root) -> Iterator[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of the tree ``root``, in key order (a depth-first walk; each node checked).

    Raises: MissingNodeError, CorruptNodeError as :func:`update`.
    """
    if root.hash == EMPTY_HASH:
        return
    todo: list[tuple[bytes, bytes, int, int]] = [(root.hash, root.version.to_bytes(8, "big"), 0, 0)]
    while todo:
        h, vb, j, kint = todo.pop()
        data = store.get(vb + _suffix(j, kint))
        if data is None:
            raise _missing(vb, j)
        if data[:1] == b"\x00":
            yield _leaf_of(data, h, vb, j, kint)
            continue
        vs, lh, lk = _verified(data, h, vb, j)
        hs, ks = lh[4], lk[4]
        for s in range(15, -1, -1):
            if ks[s] != _E:
                todo.append((hs[s], vs[s], j + 1, _slot_path(kint, j, s)))


__all__ = ["NIBBLES", "build_sorted", "get", "leaves", "node_key", "prove", "update"]
