"""A versioned binary sparse Merkle tree: the authenticated map behind Tally's state root.

The map goes from 32-byte keys to value bytes. Callers hash their own keys (:func:`.smtnode.tree_key`), so keys are
uniformly spread and a path ``p`` levels deeper than ``log2 n`` costs an adversary about ``2^p`` hashes to
grind (and never exceeds 256). The design follows Diem/Aptos' Jellyfish Merkle tree
(Gao et al., "Jellyfish Merkle Tree", Diem, 2021) in its binary form, i.e. the Diem ``SparseMerkleTree`` of
``diem/storage/jellyfish-merkle`` and ``diem/types/src/proof`` (``SparseMerkleProof``, ``SparseMerkleLeafNode``):

* Depth 256; the bit at depth ``d`` of a key (most significant bit first) chooses the child (0 left, 1 right).
* Compression: a subtree that holds exactly one leaf is stored and hashed as that leaf, placed at the subtree's
  top; an empty subtree hashes to :data:`.smtnode.EMPTY_HASH`. Internal nodes are never compressed further, so two keys
  sharing a ``p``-bit prefix sit under a chain of ``p`` internal nodes (rare: keys are hashes).
* Hashes (BLAKE2b-256, :func:`node.encoding.H`), domain separated like RFC 9162:
  ``leaf = H(0x00 ‖ key ‖ H(value))``, ``internal = H(0x01 ‖ left ‖ right)``, ``empty = 32 zero bytes``.
  The root of the empty map is therefore 32 zero bytes, and the root of a one-entry map is its leaf hash.

Storage (why nodes are keyed by version and path, as in Jellyfish): a node written by the update at version
``v`` at depth ``d`` is stored under ``node_key = v (8 B, big-endian) ‖ d (2 B) ‖ the first d bits of its path
(ceil(d/8) B, low bits zero)``; an internal node references each child by ``(hash, version)``. Every write thus
goes to a fresh key that no other version uses, so (1) the root of every retained version stays readable while
later versions are written, and (2) pruning is exact: the update that replaces or deletes a node records it as
*stale since* its version, and deleting every node stale since a version <= ``v`` removes exactly the nodes
that no version >= ``v`` uses. Keying by hash would share equal nodes between versions, but a node made stale at
one version can reappear at a later one (a value set back), and deleting it would break the later tree unless
every node were reference counted. The tree is a linear history: commit at most one update per version.

Sizes: an internal node is 81 B (``0x01 ‖ left hash ‖ left version ‖ right hash ‖ right version``), a leaf is
``33 + len(value)`` B (``0x00 ‖ key ‖ value``), a node key ``10 + ceil(depth/8)`` B, a stale index key 8 B more.
A proof is at most 256 siblings; its wire form (:meth:`Proof.to_wire`) packs to at most
:data:`MAX_PROOF_BYTES` with msgpack. With ``n`` random keys, leaves sit at depth about ``log2 n``.

Complexity: :func:`update` with ``c`` changes reads and writes O(c · log n) nodes (at most one new node per
depth per changed path); :func:`get` and :func:`prove` read O(log n) nodes; :func:`verify` computes O(log n)
hashes and needs no store. Everything here is pure: storage arrives through :class:`.smtnode.NodeStore` and the
writes go back to the caller, who commits them (e.g. in the block's LevelDB ``WriteBatch``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, Protocol, TypeVar

from ...encoding import HASH_LEN, H
from .smtnode import (
    _INTERNAL,
    _INTERNAL_LEN,
    _ZERO_VERSION,
    DEPTH,
    EMPTY_HASH,
    KEY_LEN,
    MAX_VERSION,
    CorruptNodeError,
    NodeStore,
    Root,
    StaleNode,
    UpdateResult,
    _bit,
    _check_key,
    _leaf_of,
    _load,
    _missing,
    _Node,
    _suffix,
    internal_hash,
    leaf_hash,
)

MAX_PROOF_BYTES = 9 * 1024  # packed wire proof: 256 siblings of 34 B, a 70 B leaf and headers fit


class ProofError(ValueError):
    """A wire proof is malformed (wrong types, sizes or more than 256 siblings)."""


# ---------------------------------------------------------------- update
#
# The update walks the stored tree once, down the paths of the sorted changes only (each stored node on them is
# read, checked and, if changed, rewritten exactly once per batch: shared upper paths once, not once per key).
# It runs ~10 node visits per changed key per block, so it is written for CPython's costs: versions travel as the
# 8 bytes that node keys and internal nodes hold (no int conversions), a node's key suffix is computed once and
# used for its old and new versions, and loading and joining an internal node happen inline in :func:`_apply`.

@dataclass
class _Leaf:
    """A leaf to place at the top of the subtree being rebuilt; ``old`` is its stored node (depth, node key,
    hash, version bytes) when its key and value are unchanged, so it is not rewritten if it stays at that depth."""

    kint: int
    key: bytes
    value: bytes
    old: tuple[int, bytes, bytes, bytes] | None = None


class _HasKey(Protocol):
    kint: int
    value: bytes


_L = TypeVar("_L", bound=_HasKey)


def merge_leaf(kept: _L, ch: list[tuple[int, bytes, bytes | None]], lo: int, hi: int,
               make: Callable[[int, bytes, bytes], _L]) -> tuple[list[_L], bool]:
    """Merge the stored leaf ``kept`` into the sorted changes ``ch[lo:hi]`` (``(key as int, key, new value or
    None to delete)``) under it, for this tree and the 16-ary one (:mod:`.jmt`).

    Returns the leaves of the rebuilt subtree in key order (new ones from ``make(kint, key, value)``; ``kept``
    itself where its key is unchanged or changed to its own value, so its node is not rewritten) and whether
    ``kept`` left it (deleted or given a new value: its stored node is then stale)."""
    items: list[_L] = []
    seen = False
    for k, ckey, v in ch[lo:hi]:
        if not seen and kept.kint <= k:
            seen = True
            if kept.kint < k or v == kept.value:
                items.append(kept)
                if kept.kint == k:
                    continue
        if v is not None:
            items.append(make(k, ckey, v))
    if not seen:
        items.append(kept)
        return items, False
    return items, all(x is not kept for x in items)


# A non-empty subtree at this depth, by reference: ``(hash, version bytes, known)``, an internal node (new or
# kept) or a kept node of unknown kind (``known`` false: it may be a leaf, to lift if its sibling empties). A
# plain tuple (not a NamedTuple): one is made per node visited.
_Sub = tuple[bytes, bytes, bool]
_Result = _Leaf | _Sub | None


class _Ctx:
    def __init__(self, store: NodeStore, version: int) -> None:
        self.get = store.get
        self.vbytes = version.to_bytes(8, "big")  # the version as node keys begin with it
        self.writes: dict[bytes, bytes] = {}
        self.stale: list[bytes] = []  # node keys made stale by this version


def _place(ctx: _Ctx, depth: int, r: _Result) -> tuple[bytes, bytes]:
    """The (hash, version bytes) reference of ``r`` placed at ``depth``, writing a leaf that is new or has
    moved."""
    if r is None:
        return EMPTY_HASH, _ZERO_VERSION
    if isinstance(r, tuple):
        return r[0], r[1]
    old = r.old
    if old is not None:
        if old[0] == depth:
            return old[2], old[3]
        ctx.stale.append(old[1])
    ctx.writes[ctx.vbytes + _suffix(depth, r.kint)] = b"\x00" + r.key + r.value
    return leaf_hash(r.key, r.value), ctx.vbytes


def _lift(ctx: _Ctx, depth: int, kint: int, only: _Sub) -> _Leaf | None:
    """``only``, the one non-empty child (a kept one of unknown kind) of the node at ``depth`` on the path of
    ``kint``, as a leaf to lift, or None when it is internal (it stays where it is)."""
    side_kint = kint ^ (1 << (DEPTH - 1 - depth))  # the changes, and so kint, are on the other side
    h, vb = only[0], only[1]
    nk = vb + _suffix(depth + 1, side_kint)
    data = ctx.get(nk)
    if data is None:
        raise _missing(vb, depth + 1)
    if len(data) == _INTERNAL_LEN and data[0] == _INTERNAL:
        if internal_hash(data[1:33], data[41:73]) != h:
            raise CorruptNodeError(f"internal node at version {int.from_bytes(vb, 'big')}, depth {depth + 1} "
                                   "does not match its hash")
        return None
    key, value = _leaf_of(data, h, vb, depth + 1, side_kint)
    return _Leaf(int.from_bytes(key, "big"), key, value, (depth + 1, nk, h, vb))


def _join_new(ctx: _Ctx, depth: int, kint: int, left: _Result, right: _Result) -> _Result:
    """A new subtree at ``depth`` (path of ``kint``) from its rebuilt children: lifts a lone leaf, else writes
    the internal node."""
    if left is None or right is None:
        only = right if left is None else left
        if only is None or isinstance(only, _Leaf):
            return only
        if not only[2]:
            lifted = _lift(ctx, depth, kint, only)
            if lifted is not None:
                return lifted
    lh, lv = _place(ctx, depth + 1, left)
    rh, rv = _place(ctx, depth + 1, right)
    ctx.writes[ctx.vbytes + _suffix(depth, kint)] = b"\x01" + lh + lv + rh + rv
    return (blake2b(b"\x01" + lh + rh, digest_size=HASH_LEN).digest(), ctx.vbytes, True)


def _split(kints: list[int], lo: int, hi: int, depth: int) -> int:
    """First index in ``kints[lo:hi]`` (sorted, sharing their first ``depth`` bits) whose bit ``depth`` is 1."""
    shift = DEPTH - depth
    pivot = (kints[lo] >> shift << shift) | (1 << (shift - 1))
    return bisect.bisect_left(kints, pivot, lo, hi)


def _build(ctx: _Ctx, depth: int, items: list[_Leaf], kints: list[int], lo: int, hi: int) -> _Result:
    """The subtree at ``depth`` holding exactly ``items[lo:hi]`` (sorted by key), written bottom-up."""
    if hi - lo <= 1:
        return items[lo] if hi > lo else None
    mid = _split(kints, lo, hi, depth)
    left = _build(ctx, depth + 1, items, kints, lo, mid)
    right = _build(ctx, depth + 1, items, kints, mid, hi)
    return _join_new(ctx, depth, kints[lo], left, right)


def _apply_leaf(ctx: _Ctx, data: bytes, h: bytes, vb: bytes, nk: bytes, depth: int,
                ch: list[tuple[int, bytes, bytes | None]], lo: int, hi: int) -> _Result:
    """Apply the changes ``ch[lo:hi]`` to the stored leaf ``data`` (node key ``nk``) at ``depth``."""
    key, value = _leaf_of(data, h, vb, depth, ch[lo][0])
    kept = _Leaf(int.from_bytes(key, "big"), key, value, (depth, nk, h, vb))
    items, gone = merge_leaf(kept, ch, lo, hi, _Leaf)
    if gone:
        ctx.stale.append(nk)  # the leaf was deleted or given a new value
    return _build(ctx, depth, items, [x.kint for x in items], 0, len(items))


def _apply(ctx: _Ctx, h: bytes, vb: bytes, depth: int, ch: list[tuple[int, bytes, bytes | None]],
           kints: list[int], lo: int, hi: int) -> _Result:
    """Apply the changes ``ch[lo:hi]`` (sorted, non-empty) to the stored subtree ``(h, vb)`` at ``depth``."""
    if h == EMPTY_HASH:
        items = [_Leaf(k, key, v) for k, key, v in ch[lo:hi] if v is not None]
        return _build(ctx, depth, items, [x.kint for x in items], 0, len(items))
    kint = kints[lo]
    suffix = _suffix(depth, kint)
    nk = vb + suffix
    data = ctx.get(nk)
    if data is None:
        raise _missing(vb, depth)
    if len(data) != _INTERNAL_LEN or data[0] != _INTERNAL:
        return _apply_leaf(ctx, data, h, vb, nk, depth, ch, lo, hi)
    lh, rh = data[1:33], data[41:73]
    if blake2b(b"\x01" + lh + rh, digest_size=HASH_LEN).digest() != h:
        raise CorruptNodeError(f"internal node at version {int.from_bytes(vb, 'big')}, depth {depth} does not "
                               "match its hash")
    lv, rv = data[33:41], data[73:81]
    shift = DEPTH - depth
    mid = bisect.bisect_left(kints, (kint >> shift << shift) | (1 << (shift - 1)), lo, hi)
    d1 = depth + 1
    left: _Result
    right: _Result
    if mid > lo:
        left = _apply(ctx, lh, lv, d1, ch, kints, lo, mid)
    else:
        left = (lh, lv, False) if lh != EMPTY_HASH else None
    if hi > mid:
        right = _apply(ctx, rh, rv, d1, ch, kints, mid, hi)
    else:
        right = (rh, rv, False) if rh != EMPTY_HASH else None
    # join the rebuilt children, replacing this node: lift a lone leaf, keep the node when nothing changed
    if left is None or right is None:
        only = right if left is None else left
        if only is None or isinstance(only, _Leaf):
            ctx.stale.append(nk)
            return only
        if not only[2]:
            lifted = _lift(ctx, depth, kint, only)
            if lifted is not None:
                ctx.stale.append(nk)
                return lifted
    if isinstance(left, tuple):
        nlh, nlv = left[0], left[1]
    else:
        nlh, nlv = _place(ctx, d1, left)
    if isinstance(right, tuple):
        nrh, nrv = right[0], right[1]
    else:
        nrh, nrv = _place(ctx, d1, right)
    if nlh == lh and nrh == rh and nlv == lv and nrv == rv:
        return (h, vb, True)
    ctx.stale.append(nk)
    ctx.writes[ctx.vbytes + suffix] = b"\x01" + nlh + nlv + nrh + nrv
    return (blake2b(b"\x01" + nlh + nrh, digest_size=HASH_LEN).digest(), ctx.vbytes, True)


def checked_changes(root: Root, version: int, changes: Mapping[bytes, bytes | None]
                    ) -> tuple[list[tuple[int, bytes, bytes | None]], bool]:
    """The arguments of an update checked (shared by :func:`update` and :func:`node.ledger.core.jmt.update`): the
    changes as ``(key as int, key, value or None)`` sorted by key, and whether ``root`` is the empty tree's.

    Raises:
        ValueError: a key that is not 32 bytes, a value that is not bytes or None, ``version`` not an int in
            ``[0, 2^64)``, or not greater than ``root.version`` (at least it, for an empty root).
    """
    if not isinstance(root, Root) or not isinstance(root.hash, bytes) or len(root.hash) != HASH_LEN:
        raise ValueError("root must be a Root (32-byte hash, version)")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise ValueError("version must be an int in [0, 2^64)")
    empty = root.hash == EMPTY_HASH
    if version < root.version or (version == root.version and not empty):
        raise ValueError(f"version {version} must be greater than the root's version {root.version}")
    ch: list[tuple[int, bytes, bytes | None]] = []
    for key, value in changes.items():
        _check_key(key)
        if value is not None and not isinstance(value, bytes):
            raise ValueError("a tree value is bytes, or None to delete")
        ch.append((int.from_bytes(key, "big"), key, value))
    ch.sort(key=lambda c: c[0])
    return ch, empty


def update(store: NodeStore, version: int, root: Root, changes: Mapping[bytes, bytes | None]) -> UpdateResult:
    """Apply ``changes`` (key -> new value, or None to delete; deleting an absent key is a no-op) to the tree
    ``root`` as version ``version``. Returns the new root, the node writes and the stale nodes; stores nothing.

    Deterministic: the result depends on the contents of ``changes``, not their order. Equal contents give the
    same root hash whatever the history. A batch that changes nothing returns ``root`` and no writes.
    Cost: O(len(changes) · log n) node reads and writes, n the number of keys.

    Raises:
        ValueError: a key that is not 32 bytes, a value that is not bytes or None, ``version`` not an int in
            ``[0, 2^64)``, or not greater than ``root.version`` (at least it, for an empty root).
        MissingNodeError, CorruptNodeError: ``root``'s nodes are not (intact) in ``store``.
    """
    ch, empty = checked_changes(root, version, changes)
    if not ch:
        return UpdateResult(root, {}, ())
    ctx = _Ctx(store, version)
    r = _apply(ctx, root.hash, root.version.to_bytes(8, "big"), 0, ch, [c[0] for c in ch], 0, len(ch))
    if r is None:
        new = root if empty else Root(EMPTY_HASH, version)
    else:
        h, v = _place(ctx, 0, r)
        new = Root(h, int.from_bytes(v, "big"))
    if new.hash == root.hash and not empty:
        return UpdateResult(root, {}, ())  # nothing changed (every change was a no-op)
    mk = tuple.__new__  # StaleNode(version, nk) without the NamedTuple's Python-level __new__ (one per node)
    return UpdateResult(new, ctx.writes, tuple([mk(StaleNode, (version, nk)) for nk in ctx.stale]))


# ---------------------------------------------------------------- reads and proofs

@dataclass(frozen=True)
class Proof:
    """Proof that a key holds a value, or holds none, under a root hash.

    ``siblings``: the sibling hashes on the key's path from the root down (``siblings[d]`` at depth ``d + 1``;
    at most 256). ``leaf``: ``(key, H(value))`` of the leaf found at the end of the path, or None where the
    path ends in an empty subtree. For an absent key the leaf, if any, is another key's, sharing the path.
    """

    siblings: tuple[bytes, ...]
    leaf: tuple[bytes, bytes] | None

    def to_wire(self) -> list[Any]:
        """msgpack-friendly ``[siblings, leaf]``: an empty sibling travels as ``b""``, the leaf as
        ``[key, value_hash]`` or None. Packs to at most :data:`MAX_PROOF_BYTES`."""
        sib = [b"" if s == EMPTY_HASH else s for s in self.siblings]
        return [sib, None if self.leaf is None else [self.leaf[0], self.leaf[1]]]

    @classmethod
    def from_wire(cls, obj: Any) -> Proof:
        """Raises: ProofError unless ``obj`` is a canonical wire proof (:meth:`to_wire`)."""
        if not isinstance(obj, (list, tuple)) or len(obj) != 2 or not isinstance(obj[0], (list, tuple)):
            raise ProofError("a proof is [siblings, leaf]")
        sib, leaf = obj
        if len(sib) > DEPTH:
            raise ProofError(f"a proof has at most {DEPTH} siblings")
        out = []
        for s in sib:
            if not isinstance(s, bytes) or len(s) not in (0, HASH_LEN) or s == EMPTY_HASH:
                raise ProofError("a sibling is 32 bytes (not all zero), or b\"\" for an empty subtree")
            out.append(s or EMPTY_HASH)
        if leaf is not None:
            if not (isinstance(leaf, (list, tuple)) and len(leaf) == 2
                    and all(isinstance(x, bytes) and len(x) == HASH_LEN for x in leaf)):
                raise ProofError("a proof's leaf is [key, value_hash] of 32 bytes each, or None")
            return cls(tuple(out), (leaf[0], leaf[1]))
        return cls(tuple(out), None)


def _walk(store: NodeStore, root: Root, key: bytes) -> tuple[list[bytes], _Node | None]:
    _check_key(key)
    kint = int.from_bytes(key, "big")
    h, v = root.hash, root.version
    siblings: list[bytes] = []
    for depth in range(DEPTH + 1):
        if h == EMPTY_HASH:
            return siblings, None
        node = _load(store, h, v, depth, kint)
        if node.leaf:
            return siblings, node
        b = _bit(kint, depth)
        siblings.append(node.children[1 - b][0])
        h, v = node.children[b]
    raise CorruptNodeError("tree path longer than 256")


def get(store: NodeStore, root: Root, key: bytes) -> bytes | None:
    """The value of ``key`` in the tree ``root``, or None. Every node read is checked against its hash.

    Raises: ValueError for a key that is not 32 bytes; MissingNodeError, CorruptNodeError as :func:`update`.
    """
    node = _walk(store, root, key)[1]
    return node.value if node is not None and node.key == key else None


def prove(store: NodeStore, root: Root, key: bytes) -> Proof:
    """A proof of ``key``'s value in ``root`` (inclusion), or of its absence (non-inclusion).

    Raises: ValueError for a key that is not 32 bytes; MissingNodeError, CorruptNodeError as :func:`update`.
    """
    siblings, node = _walk(store, root, key)
    return Proof(tuple(siblings), None if node is None else (node.key, H(node.value)))


def verify(proof: Proof | Any, root_hash: bytes, key: bytes, value: bytes | None) -> bool:
    """Whether ``proof`` (a :class:`Proof` or its wire form) shows that ``key`` holds ``value`` (None: holds
    nothing) in the tree whose root hash is ``root_hash``. Pure, needs no store; any malformed input gives False,
    never an exception. Checks as Diem's ``SparseMerkleProof::verify``: the leaf must be the key's own for
    inclusion, and for non-inclusion either absent or another key sharing the proof's path."""
    try:
        p = proof if isinstance(proof, Proof) else Proof.from_wire(proof)
    except ProofError:
        return False
    if not (isinstance(root_hash, bytes) and len(root_hash) == HASH_LEN and isinstance(key, bytes)
            and len(key) == KEY_LEN and (value is None or isinstance(value, bytes))):
        return False
    kint, n = int.from_bytes(key, "big"), len(p.siblings)
    if value is not None:
        if p.leaf is None or p.leaf != (key, H(value)):
            return False
        cur = H(b"\x00", key, p.leaf[1])
    elif p.leaf is None:
        cur = EMPTY_HASH
    else:
        lk = int.from_bytes(p.leaf[0], "big")
        if lk == kint or (n and (lk ^ kint) >> (DEPTH - n)):
            return False
        cur = H(b"\x00", p.leaf[0], p.leaf[1])
    for depth in range(n - 1, -1, -1):
        s = p.siblings[depth]
        cur = internal_hash(s, cur) if _bit(kint, depth) else internal_hash(cur, s)
    return cur == root_hash
