"""The binary sparse Merkle tree's vocabulary (:mod:`.smt` holds the design, the update, the reads and the proofs).

Here: the sizes (:data:`KEY_LEN`, :data:`DEPTH`, :data:`EMPTY_HASH`), the errors a tree read raises, the
:class:`Root`, :class:`StaleNode` and :class:`UpdateResult` records, the hashes (:func:`leaf_hash`,
:func:`internal_hash`, :func:`tree_key`), the node keys (:func:`node_key`), the decoding and checking of a stored
node, and the node stores (the :class:`NodeStore` protocol, :class:`MemoryNodeStore`, :class:`OverlayNodeStore`).
Shared by :mod:`.smt` and the 16-ary tree (:mod:`.jmtnode`, :mod:`.jmt`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from hashlib import blake2b
from typing import Any, NamedTuple, Protocol

from ...encoding import HASH_LEN, H

KEY_LEN = HASH_LEN  # bytes in a tree key
DEPTH = 8 * KEY_LEN  # 256 levels below the root
EMPTY_HASH = bytes(HASH_LEN)  # the hash of an empty subtree, and the root of the empty map
MAX_VERSION = (1 << 64) - 1
_INTERNAL, _LEAF = 1, 0
_INTERNAL_LEN = 1 + 2 * (HASH_LEN + 8)


class TreeError(Exception):
    """Base of the errors a tree read raises."""


class MissingNodeError(TreeError, LookupError):
    """A node the root refers to is not in the store: its version was pruned, or its writes never committed."""


class CorruptNodeError(TreeError, ValueError):
    """A stored node is malformed or does not hash to the hash its parent (or the root) records."""


class NodeStore(Protocol):
    """Where tree nodes are read from: LevelDB under a prefix for the ledger, :class:`MemoryNodeStore` in tests."""

    def get(self, node_key: bytes) -> bytes | None:
        """The stored node bytes under ``node_key``, or None."""
        ...


class Root(NamedTuple):
    """A tree root: its 32-byte ``hash`` (what a header commits to) and the ``version`` that wrote its node.

    The root node lives at ``node_key(version, 0)``. A root whose hash is :data:`EMPTY_HASH` is the empty map
    and has no node. ``to_bytes`` is 40 bytes (hash ‖ version, 8 B big-endian) for the caller to persist.
    """

    hash: bytes
    version: int

    def to_bytes(self) -> bytes:
        return self.hash + self.version.to_bytes(8, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> Root:
        """Raises: ValueError unless ``data`` is 40 bytes."""
        if not isinstance(data, bytes) or len(data) != HASH_LEN + 8:
            raise ValueError("a tree root is 40 bytes: hash ‖ version")
        return cls(data[:HASH_LEN], int.from_bytes(data[HASH_LEN:], "big"))


EMPTY_ROOT = Root(EMPTY_HASH, 0)  # the empty map; its first update may use any version >= 0


class StaleNode(NamedTuple):
    """A node no version >= ``since`` uses. ``index_key()`` (``since`` 8 B big-endian ‖ node key) sorts by
    version, so a store can keep them in one index and prune with a range scan up to :func:`prune_bound`."""

    since: int
    node_key: bytes

    def index_key(self) -> bytes:
        return self.since.to_bytes(8, "big") + self.node_key

    @classmethod
    def from_index_key(cls, data: bytes) -> StaleNode:
        """Raises: ValueError for bytes too short to be a stale index key."""
        if len(data) < 17:
            raise ValueError("a stale index key is at least 17 bytes")
        return cls(int.from_bytes(data[:8], "big"), data[8:])


def prune_bound(keep_from: int) -> bytes:
    """Exclusive upper bound of the stale index keys to delete (with their nodes) so that exactly the versions
    >= ``keep_from`` stay readable: every :meth:`StaleNode.index_key` below it has ``since <= keep_from``."""
    return (keep_from + 1).to_bytes(8, "big")


class UpdateResult(NamedTuple):
    """What :func:`.smt.update` returns: the new root, the node writes (node key -> node bytes) and the nodes it made
    stale. Nothing is stored until the caller commits ``writes`` (and records ``stale``)."""

    root: Root
    writes: dict[bytes, bytes]
    stale: tuple[StaleNode, ...]


def tree_key(tag: bytes, raw: bytes) -> bytes:
    """The tree key of ``raw`` in table ``tag``: ``H(len(tag) ‖ tag ‖ raw)``, 32 bytes (the length byte keeps
    ``(b"ab", b"c")`` and ``(b"a", b"bc")`` apart).

    Raises: ValueError for a tag that is empty or longer than 255 bytes. TypeError for non-bytes.
    """
    if not isinstance(tag, bytes) or not isinstance(raw, bytes):
        raise TypeError("tag and raw key must be bytes")
    if not 1 <= len(tag) <= 255:
        raise ValueError("a table tag is 1 to 255 bytes")
    return H(bytes([len(tag)]), tag, raw)


# The hashes below are :func:`node.encoding.H` (BLAKE2b-256 of the concatenation) written out with one call
# each: they run ~20 times per changed key per block, where each layer of Python costs microseconds.

_H0 = blake2b(b"\x00", digest_size=HASH_LEN)  # 0x00 / 0x01 already absorbed: copy() and update() the rest
_H1 = blake2b(b"\x01", digest_size=HASH_LEN)


def leaf_hash(key: bytes, value: bytes) -> bytes:
    """``H(0x00 ‖ key ‖ H(value))``: the hash of a leaf, 32 bytes."""
    h = _H0.copy()
    h.update(key)
    h.update(blake2b(value, digest_size=HASH_LEN).digest())
    return h.digest()


def internal_hash(left: bytes, right: bytes) -> bytes:
    """``H(0x01 ‖ left ‖ right)``: the hash of an internal node, 32 bytes."""
    h = _H1.copy()
    h.update(left)
    h.update(right)
    return h.digest()


def node_key(version: int, depth: int, key: bytes | int) -> bytes:
    """Storage key of the node at ``depth`` on the path of ``key`` (bytes or its big-endian int) written at
    ``version``: ``version (8 B) ‖ depth (2 B) ‖ first depth bits of key (ceil(depth/8) B)``."""
    k = key if isinstance(key, int) else int.from_bytes(key, "big")
    return _nk(version.to_bytes(8, "big"), depth, k)


def _nk(version: bytes, depth: int, kint: int) -> bytes:
    """:func:`node_key` with the version already as its 8 bytes and the key as an int."""
    return version + _suffix(depth, kint)


_DEPTH_BYTES = [d.to_bytes(2, "big") for d in range(DEPTH + 1)]
_ZERO_VERSION = bytes(8)  # version 0, as node keys and internal nodes write it (an empty child's)


def _suffix(depth: int, kint: int) -> bytes:
    """What follows the version in the key of the node at ``depth`` on the path of ``kint``: ``depth (2 B) ‖
    its first depth bits (ceil(depth/8) B, low bits zero)``. One node's keys at every version share it."""
    nb = (depth + 7) >> 3
    return _DEPTH_BYTES[depth] + ((kint >> (DEPTH - depth)) << ((nb << 3) - depth)).to_bytes(nb, "big")


# ---------------------------------------------------------------- node encoding

class _Node(NamedTuple):
    leaf: bool
    key: bytes  # leaf: its key
    value: bytes  # leaf: its value
    children: tuple[tuple[bytes, int], tuple[bytes, int]]  # internal: (hash, version) left, right


def _load(store: NodeStore, h: bytes, version: int, depth: int, kint: int) -> _Node:
    data = store.get(_nk(version.to_bytes(8, "big"), depth, kint))
    if data is None:
        raise _missing(version, depth)
    if len(data) == _INTERNAL_LEN and data[0] == _INTERNAL:
        lh, rh = data[1:33], data[41:73]
        if internal_hash(lh, rh) != h:
            raise CorruptNodeError(f"internal node at version {version}, depth {depth} does not match its hash")
        kids = ((lh, int.from_bytes(data[33:41], "big")), (rh, int.from_bytes(data[73:81], "big")))
        return _Node(False, b"", b"", kids)
    key, value = _leaf_of(data, h, version, depth, kint)
    return _Node(True, key, value, ((EMPTY_HASH, 0), (EMPTY_HASH, 0)))


def _missing(version: int | bytes, depth: int) -> MissingNodeError:
    v = version if isinstance(version, int) else int.from_bytes(version, "big")
    return MissingNodeError(f"tree node at version {v}, depth {depth} is not in the store "
                            "(its version was pruned, or its writes were never committed)")


def _leaf_of(data: bytes, h: bytes, version: int | bytes, depth: int, kint: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of the stored leaf ``data`` on the path of ``kint`` at ``depth``, checked against its hash
    ``h``. Raises: CorruptNodeError (not a leaf, wrong hash, off its path)."""
    v = version if isinstance(version, int) else int.from_bytes(version, "big")
    if len(data) >= 1 + KEY_LEN and data[0] == _LEAF:
        key, value = data[1:33], data[33:]
        if leaf_hash(key, value) != h:
            raise CorruptNodeError(f"leaf at version {v}, depth {depth} does not match its hash")
        if (int.from_bytes(key, "big") ^ kint) >> (DEPTH - depth):
            raise CorruptNodeError(f"leaf at version {v}, depth {depth} is off its path")
        return key, value
    raise CorruptNodeError(f"malformed tree node at version {v}, depth {depth}")


def _bit(kint: int, depth: int) -> int:
    return (kint >> (DEPTH - 1 - depth)) & 1


def _check_key(key: Any) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_LEN:
        raise ValueError(f"a tree key is {KEY_LEN} bytes (hash your key with tree_key)")


# ---------------------------------------------------------------- stores

class MemoryNodeStore:
    """An in-memory :class:`NodeStore` with a stale index and pruning, for tests and benchmarks."""

    def __init__(self) -> None:
        self.nodes: dict[bytes, bytes] = {}
        self.stale: dict[int, list[bytes]] = {}

    def get(self, node_key: bytes) -> bytes | None:
        return self.nodes.get(node_key)

    def commit(self, result: UpdateResult) -> None:
        """Store ``result``'s writes and record its stale nodes."""
        self.nodes.update(result.writes)
        for s in result.stale:
            self.stale.setdefault(s.since, []).append(s.node_key)

    def prune(self, keep_from: int) -> int:
        """Delete every node stale since a version <= ``keep_from``; versions >= ``keep_from`` stay readable.
        Returns the number of nodes deleted."""
        done = 0
        for since in [s for s in self.stale if s <= keep_from]:
            for nk in self.stale.pop(since):
                done += self.nodes.pop(nk, None) is not None
        return done


class OverlayNodeStore:
    """``base`` seen through pending ``writes`` (e.g. a proposed block's, not yet committed), so that a further
    :func:`.smt.update` can build on an uncommitted one."""

    def __init__(self, base: NodeStore, writes: Iterable[Mapping[bytes, bytes]]) -> None:
        self.base = base
        self.pending: dict[bytes, bytes] = {}
        for w in writes:
            self.pending.update(w)

    def get(self, node_key: bytes) -> bytes | None:
        got = self.pending.get(node_key)
        return got if got is not None else self.base.get(node_key)
