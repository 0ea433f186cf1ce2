"""Stored nodes of the 16-ary state tree (:mod:`node.ledger.core.jmt`): keys, bytes, binary hashing, a cache.

* Node keys: ``version (8 B, big-endian) ‖ j (1 B) ‖ the first j nibbles of the path (ceil(j/2) B, low nibble
  zero)`` for the node at nibble depth ``j``.
* Node bytes: internal ``0x01 ‖ present bitmap (2 B) ‖ leaf bitmap (2 B) ‖ (hash ‖ version) per present slot``
  (bit ``s`` is slot ``s``; 45 to 645 B); leaf ``0x00 ‖ key ‖ value`` (the binary tree's,
  :mod:`node.ledger.core.smt`).
* An internal node's hash is the binary hash of its 16 slots (:func:`_reduce`, :func:`_full`: Aptos'
  ``InternalNode::merkle_hash`` in aptos-core ``storage/jellyfish-merkle/src/node_type/mod.rs``): two empties make
  an empty, an empty beside a leaf lifts the leaf (the binary tree's compression), anything else is
  ``H(0x01 ‖ left ‖ right)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b

from ...encoding import HASH_LEN
from .smtnode import DEPTH, EMPTY_HASH, KEY_LEN, CorruptNodeError, MissingNodeError, internal_hash, leaf_hash

NIBBLES = DEPTH // 4  # 64 nibbles in a key: internal nodes at nibble depths 0..63, leaves at 0..64
_ZERO_VERSION = bytes(8)
_NIB = [bytes([j]) for j in range(NIBBLES + 1)]
_EMPTY16 = [EMPTY_HASH] * 16
_HEADER = 5  # 0x01 ‖ present bitmap ‖ leaf bitmap
_CHILD = HASH_LEN + 8
_E, _L, _I = 0, 1, 2  # slot kinds: empty, leaf, internal
_OFFSETS = range(_HEADER, _HEADER + 16 * _CHILD, _CHILD)  # the children of a full node
# BLAKE2b-256 with 0x01 already absorbed, for _rehash's inline smt.internal_hash (H(0x01 ‖ left ‖ right))
_H1 = blake2b(b"\x01", digest_size=HASH_LEN)


def node_key(version: int, nibbles: int, key: bytes | int) -> bytes:
    """Storage key of the node at nibble depth ``nibbles`` (0..64) on the path of ``key`` (bytes or its
    big-endian int) written at ``version``: ``version (8 B) ‖ nibbles (1 B) ‖ the path (ceil(nibbles/2) B)``."""
    k = key if isinstance(key, int) else int.from_bytes(key, "big")
    return version.to_bytes(8, "big") + _suffix(nibbles, k)


def _suffix(j: int, kint: int) -> bytes:
    """What follows the version in the key of the node at nibble depth ``j`` on the path of ``kint``."""
    nb = (j + 1) >> 1
    return _NIB[j] + ((kint >> (DEPTH - 4 * j)) << ((nb << 3) - 4 * j)).to_bytes(nb, "big")


def _missing(vb: bytes, j: int) -> MissingNodeError:
    return MissingNodeError(f"tree node at version {int.from_bytes(vb, 'big')}, nibble depth {j} is not in the "
                            "store (its version was pruned, or its writes were never committed)")


# ---------------------------------------------------------------- node encoding and hashing

def _reduce(hs: list[bytes], ks: list[int]) -> tuple[list[bytes], list[int]]:
    """One binary level up: pairs of (hash, kind) to their parents, with the binary tree's compression (an
    empty beside a leaf lifts the leaf; two empties stay empty)."""
    nh: list[bytes] = []
    nk: list[int] = []
    for i in range(0, len(hs), 2):
        a, b = ks[i], ks[i + 1]
        if b == _E and a != _I:
            nh.append(hs[i])
            nk.append(a)
        elif a == _E and b != _I:
            nh.append(hs[i + 1])
            nk.append(b)
        else:
            nh.append(internal_hash(hs[i], hs[i + 1]))
            nk.append(_I)
    return nh, nk


def _merkle(hs: list[bytes], ks: list[int]) -> tuple[bytes, int]:
    """``(hash, kind)`` of the 4-level binary subtree over 16 slots (Aptos ``InternalNode::merkle_hash``)."""
    for _ in range(4):
        hs, ks = _reduce(hs, ks)
    return hs[0], ks[0]


# A node's binary subtree, level by level: ``(LH, LK)``, the hashes and kinds at binary level ``t`` below the node
# (``t`` = 0: the node itself, 1 entry; ``t`` = 4: its 16 slots). Kept with a decoded node so that changing one
# slot rehashes the 4 binary nodes above it, not 15.
_Levels = tuple[list[list[bytes]], list[list[int]]]
_Dec = tuple[list[bytes], list[list[bytes]], list[list[int]]]  # a decoded node: slot versions, LH, LK


def _full(hs: list[bytes], ks: list[int]) -> _Levels:
    if _E not in ks:  # a full node (the upper levels of a large tree): every binary node is internal
        lh: list[list[bytes]] = [hs]
        cur = hs
        for _ in range(4):
            cur = [internal_hash(cur[i], cur[i + 1]) for i in range(0, len(cur), 2)]
            lh.append(cur)
        lh.reverse()
        return lh, [[_I], [_I] * 2, [_I] * 4, [_I] * 8, ks]
    if ks.count(_E) >= 12:  # a sparse node (the bottom of the tree): walk up from its few children only
        lh = [[EMPTY_HASH], [EMPTY_HASH] * 2, [EMPTY_HASH] * 4, [EMPTY_HASH] * 8, hs]
        lk: list[list[int]] = [[_E], [_E] * 2, [_E] * 4, [_E] * 8, ks]
        _rehash(lh, lk, [s for s in range(16) if ks[s] != _E])
        return lh, lk
    lh = [hs]
    lk = [ks]
    for _ in range(4):
        hs, ks = _reduce(hs, ks)
        lh.append(hs)
        lk.append(ks)
    lh.reverse()
    lk.reverse()
    return lh, lk


def _rehash(lh: list[list[bytes]], lk: list[list[int]], dirty: list[int]) -> None:
    """Recompute, in place, the binary nodes of ``(lh, lk)`` above the changed slots ``dirty``."""
    idx: Iterable[int] = dirty
    for t in (3, 2, 1, 0):
        ch, ck, nh, nk = lh[t + 1], lk[t + 1], lh[t], lk[t]
        idx = [dirty[0] >> (4 - t)] if len(dirty) == 1 else {i >> 1 for i in idx}
        for i in idx:
            j = 2 * i
            a, b = ck[j], ck[j + 1]
            if b == _E and a != _I:
                nh[i], nk[i] = ch[j], a
            elif a == _E and b != _I:
                nh[i], nk[i] = ch[j + 1], b
            else:
                h = _H1.copy()  # (internal_hash inline: the hottest hash of a block)
                h.update(ch[j])
                h.update(ch[j + 1])
                nh[i] = h.digest()
                nk[i] = _I


DECODED_NODES = 1 << 12  # decoded internal nodes per generation of the cache (two generations)
CACHED_DEPTH = 3  # nodes at nibble depths 0..3 are cached decoded (1 + 16 + 256 + 4096: read by every block)
# An entry is the node's binary levels above its slots, packed (:func:`_pack`): two bytes objects in a tuple, which
# the cyclic garbage collector stops tracking after its first pass. Lists of hashes here (~13 per node, ~4,000
# nodes rewritten per block) made every collection after a block walk ~50,000 new containers: 40-100 ms a block.
_dec_hot: dict[bytes, tuple[bytes, bytes]] = {}
_dec_cold: dict[bytes, tuple[bytes, bytes]] = {}
_INNER = ((0, 1), (1, 3), (3, 7), (7, 15))  # binary levels 0..3 of a node: positions in its packed inner hashes


def _pack(lh: list[list[bytes]], lk: list[list[int]]) -> tuple[bytes, bytes]:
    """A node's binary levels 0..3 (15 hashes and kinds; level 4 is its slots, read from its bytes) as
    ``(hashes: 15 × 32 B, kinds: 15 B)``."""
    return b"".join([*lh[0], *lh[1], *lh[2], *lh[3]]), bytes([*lk[0], *lk[1], *lk[2], *lk[3]])


def _unpack(packed: tuple[bytes, bytes], hs: list[bytes], ks: list[int]) -> _Levels:
    """The binary levels of a node from :func:`_pack`'s form and its slots (new lists: the caller may change them)."""
    inner, kinds = packed
    return ([[inner[o:o + HASH_LEN] for o in range(a * HASH_LEN, b * HASH_LEN, HASH_LEN)] for a, b in _INNER] + [hs],
            [list(kinds[a:b]) for a, b in _INNER] + [ks])


def _keep(data: bytes, packed: tuple[bytes, bytes]) -> None:
    global _dec_hot, _dec_cold
    _dec_hot[data] = packed
    if len(_dec_hot) >= DECODED_NODES:
        _dec_cold, _dec_hot = _dec_hot, {}


def _remember(data: bytes, levels: _Levels) -> None:
    """Cache the binary levels of the internal node ``data`` (see :func:`_load`)."""
    _keep(data, _pack(*levels))


def _load(data: bytes, vb: bytes, j: int) -> _Dec:
    """The decoded internal node ``data`` with its binary levels, as new lists the caller may change. The binary
    levels above the slots come from a bounded cache keyed by the node's bytes (a pure function of them: whatever
    store they came from, the entry is right) for the upper :data:`CACHED_DEPTH` levels, which every block reads
    again (below them a block's paths rarely meet). Memory: ~0.6 KiB per node, at most ~5 MiB
    (:data:`DECODED_NODES`). Safe to call from several threads: an entry is a pure function of its key, so a race
    can only lose an entry.
    Raises: CorruptNodeError for bytes that are not a canonical internal node."""
    hs, vs, ks = _decode(data, vb, j)
    packed = _dec_hot.get(data)
    if packed is None:
        packed = _dec_cold.get(data)
        if packed is None:
            lh, lk = _full(hs, ks)
            if j <= CACHED_DEPTH:
                _remember(data, (lh, lk))
            return vs, lh, lk
        _keep(data, packed)
    lh, lk = _unpack(packed, hs, ks)
    return vs, lh, lk


def _verified(data: bytes, h: bytes, vb: bytes, j: int) -> _Dec:
    """:func:`_load`, checked against the hash ``h`` its parent records. Raises: CorruptNodeError."""
    dec = _load(data, vb, j)
    if dec[2][0][0] != _I:
        raise _malformed(vb, j)
    if dec[1][0][0] != h:
        raise CorruptNodeError(f"internal node at version {int.from_bytes(vb, 'big')}, nibble depth {j} does not "
                               "match its hash")
    return dec


def _decode(data: bytes, vb: bytes, j: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """The 16 slots ``(hashes, version bytes, kinds)`` of the stored internal node ``data``.
    Raises: CorruptNodeError for bytes that are not a canonical internal node."""
    n = len(data)
    if n < _HEADER + _CHILD or data[0] != 1:
        raise _malformed(vb, j)
    present = (data[1] << 8) | data[2]
    leaves = (data[3] << 8) | data[4]
    if leaves & ~present or n != _HEADER + _CHILD * present.bit_count():
        raise _malformed(vb, j)
    if present == 0xFFFF:  # full
        return ([data[o:o + HASH_LEN] for o in _OFFSETS], [data[o + HASH_LEN:o + _CHILD] for o in _OFFSETS],
                [_L if leaves >> s & 1 else _I for s in range(16)])
    hs = list(_EMPTY16)
    vs = [_ZERO_VERSION] * 16
    ks = [_E] * 16
    off = _HEADER
    p = present
    while p:  # the present slots only, lowest first (a node below the top levels has a few)
        low = p & -p
        s = low.bit_length() - 1
        p ^= low
        hs[s] = data[off:off + HASH_LEN]
        vs[s] = data[off + HASH_LEN:off + _CHILD]
        ks[s] = _L if leaves & low else _I
        off += _CHILD
    return hs, vs, ks


def _malformed(vb: bytes, j: int) -> CorruptNodeError:
    return CorruptNodeError(f"malformed tree node at version {int.from_bytes(vb, 'big')}, nibble depth {j}")


def _encode(hs: list[bytes], vs: list[bytes], ks: list[int]) -> bytes:
    if _E not in ks:
        leaves = sum(1 << s for s in range(16) if ks[s] == _L)
        return bytes((1, 255, 255, leaves >> 8, leaves & 255)) + b"".join([hs[s] + vs[s] for s in range(16)])
    present = leaves = 0
    parts: list[bytes] = []
    for s in range(16):
        k = ks[s]
        if k:
            present |= 1 << s
            if k == _L:
                leaves |= 1 << s
            parts.append(hs[s])
            parts.append(vs[s])
    return bytes((1, present >> 8, present & 255, leaves >> 8, leaves & 255)) + b"".join(parts)


def _leaf_of(data: bytes, h: bytes, vb: bytes, j: int, kint: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of the stored leaf ``data`` at nibble depth ``j`` on the path of ``kint``, checked against
    its hash ``h``. Raises: CorruptNodeError (not a leaf, wrong hash, off its path)."""
    if len(data) >= 1 + KEY_LEN and data[0] == 0:
        key, value = data[1:1 + KEY_LEN], data[1 + KEY_LEN:]
        if leaf_hash(key, value) != h:
            raise CorruptNodeError(f"leaf at version {int.from_bytes(vb, 'big')}, nibble depth {j} does not match "
                                   "its hash")
        if (int.from_bytes(key, "big") ^ kint) >> (DEPTH - 4 * j):
            raise CorruptNodeError(f"leaf at version {int.from_bytes(vb, 'big')}, nibble depth {j} is off its path")
        return key, value
    raise _malformed(vb, j)


def _slot_path(kint: int, j: int, s: int) -> int:
    """A key int on the path of slot ``s`` of the node at nibble depth ``j`` on the path of ``kint``."""
    shift = DEPTH - 4 * j - 4
    return (((kint >> (shift + 4)) << 4) | s) << shift
