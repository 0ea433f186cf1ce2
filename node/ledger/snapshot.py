"""State snapshots: the stored state at a height as content-addressed chunks, checked against a finalised header.

A snapshot of the state after block ``h`` is a :class:`Manifest` — the height, the block hash, the counter, the
entry counts, the state root, and the ids of its chunks — plus the chunks themselves: each a msgpack list of
``[table index, key, stored value bytes]`` entries in key order (a table's index is its place in :data:`TABLES`,
the tables ordered by their modules' store keys, which never change for a table), at most :data:`CHUNK_BYTES`
long, named by ``H(tag ‖ bytes)``. Anyone may serve a snapshot; nothing in it is trusted:

* a chunk is accepted only if its bytes hash to an id the manifest lists (an altered chunk is refused, and can
  be fetched from another peer);
* the manifest is accepted only if, after every chunk is in, the sparse Merkle root of the entries it produced
  (:mod:`node.ledger.core.tree`) equals the ``state_root`` of header ``h + 1`` — which commits to the state after
  block ``h`` — and that header carries precommits of more than 2/3 of the validators (:func:`verify_header`).

Restoring writes the entries, the tree and the meta in one batch, and records ``h`` as the store's *base*: blocks
below it are absent, the node follows the chain from block ``h + 1`` on (Cosmos' state sync, ADR-053; CometBFT
``statesync``). Snapshot bytes per live item are the stored value plus ~40 B of key and framing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..encoding import DecodeError, H, pack, unpack
from . import statedb
from .core import tree as tr
from .core.block import Header
from .core.domain import MAX_DOMAIN, mismatch
from .core.modules import STORE_KEYS
from .core.records import MAPS, SETS
from .core.smtnode import EMPTY_ROOT, Root
from .core.state import State
from .core.valset import ValidatorSet
from .proofs import verify_header

CHUNK_BYTES = 1 << 20  # bytes per chunk at most (one chunk may hold one larger entry alone)
CHUNK_TAG = b"tally/snapshot-chunk/v2"  # v1: tables in a list kept by hand (before modules declared store keys)
TABLES = tuple(sorted(MAPS + SETS, key=lambda t: STORE_KEYS[t]))
MAX_CHUNKS = 1 << 20


class SnapshotError(ValueError):
    """A snapshot or chunk that does not check out (the message says which and why)."""


def chunk_id(data: bytes) -> bytes:
    """The 32-byte content id of a chunk's bytes."""
    return H(CHUNK_TAG, data)


@dataclass(frozen=True)
class Manifest:
    """What a snapshot claims: the state after block ``height`` (hash ``last_hash``), its counter, entries per
    table, state root (40 bytes: hash ‖ version) and chunk ids in order."""

    chain_id: str
    height: int
    last_hash: bytes
    seq: int
    counts: tuple[int, ...]
    root: bytes
    chunks: tuple[bytes, ...]

    def to_wire(self) -> list[Any]:
        return [self.chain_id, self.height, self.last_hash, self.seq, list(self.counts), self.root,
                list(self.chunks)]

    @classmethod
    def from_wire(cls, x: Any) -> Manifest:
        """Raises: SnapshotError for anything malformed."""
        try:
            chain, height, last, seq, counts, root, chunks = x
            ok = (isinstance(chain, str) and len(chain) <= MAX_DOMAIN and isinstance(height, int) and height >= 0
                  and isinstance(last, bytes) and len(last) == 32 and isinstance(seq, int) and isinstance(counts, list)
                  and len(counts) == len(TABLES) and all(isinstance(c, int) and c >= 0 for c in counts)
                  and isinstance(root, bytes) and len(root) == 40 and isinstance(chunks, list)
                  and len(chunks) <= MAX_CHUNKS and all(isinstance(c, bytes) and len(c) == 32 for c in chunks))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise SnapshotError("malformed snapshot manifest")
        return cls(chain, height, last, seq, tuple(counts), root, tuple(chunks))

    @property
    def id(self) -> bytes:
        return H(b"tally/snapshot/v2", pack(self.to_wire()))


def _entries(db: Any) -> Iterator[list[Any]]:
    for i, name in enumerate(TABLES):
        prefix = statedb.PREFIX[name]
        with db.iterator(prefix=prefix) as it:
            for k, v in it:
                yield [i, k[len(prefix):], v]


def make(db: Any, genesis_chain_id: str, chunk_bytes: int = CHUNK_BYTES,
         put: Callable[[bytes, bytes], None] | None = None) -> tuple[Manifest, dict[bytes, bytes]]:
    """A snapshot of the state stored in ``db`` (read through one LevelDB snapshot, so blocks may be committed
    meanwhile). Returns the manifest and ``{chunk id: chunk bytes}``; with ``put``, each chunk is given to
    ``put(id, bytes)`` as it is made instead (the dict stays empty: memory stays at one chunk,
    :class:`node.ledger.snapstore.SnapshotDir`).

    Raises:
        SnapshotError: no state is stored. OSError: from ``put``.
    """
    snap = db.snapshot()
    try:
        meta = statedb.read_meta(snap)
        if meta is None:
            raise SnapshotError("no stored state to snapshot")
        height, last_hash, seq, counts, root = meta
        chunks: dict[bytes, bytes] = {}
        keep = put or chunks.__setitem__
        order: list[bytes] = []
        cur: list[list[Any]] = []
        size = 0
        for e in _entries(snap):
            n = len(e[1]) + len(e[2]) + 8
            if cur and size + n > chunk_bytes:
                data = pack(cur)
                order.append(chunk_id(data))
                keep(order[-1], data)
                cur, size = [], 0
            cur.append(e)
            size += n
        if cur:
            data = pack(cur)
            order.append(chunk_id(data))
            keep(order[-1], data)
    finally:
        snap.close()
    m = Manifest(genesis_chain_id, height, last_hash, seq, tuple(counts.get(n, 0) for n in TABLES),
                 root.to_bytes(), tuple(order))
    return m, chunks


def check_chunk(manifest: Manifest, index: int, data: bytes) -> list[list[Any]]:
    """The entries of chunk ``index`` if ``data`` is that chunk, else raises.

    Raises:
        SnapshotError: wrong id (an altered or foreign chunk), malformed entries, keys out of order.
    """
    if not 0 <= index < len(manifest.chunks):
        raise SnapshotError(f"no chunk {index} in this snapshot")
    if chunk_id(data) != manifest.chunks[index]:
        raise SnapshotError(f"chunk {index} does not match the manifest (altered or another snapshot's)")
    try:
        rows = unpack(data, max_size=4 * CHUNK_BYTES)
    except DecodeError as e:
        raise SnapshotError(f"chunk {index}: {e}") from None
    if not isinstance(rows, list) or not rows:
        raise SnapshotError(f"chunk {index} is not a list of entries")
    last = None
    for r in rows:
        if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], int) and 0 <= r[0] < len(TABLES)
                and isinstance(r[1], bytes) and isinstance(r[2], bytes)):
            raise SnapshotError(f"chunk {index}: malformed entry")
        if last is not None and (r[0], r[1]) <= last:
            raise SnapshotError(f"chunk {index}: entries out of order")
        last = (r[0], r[1])
    return rows


def check_manifest(manifest: Manifest, header: Header, chain_id: str, max_chunks: int = MAX_CHUNKS) -> None:
    """Check, before any chunk is fetched, everything that binds ``manifest`` to ``header`` (header ``h + 1``,
    whose commit the caller checks with :func:`verify_header`): the network (``chain_id``: this network's signing
    domain, chain id and genesis hash, :mod:`node.ledger.core.domain`), the height (``h + 1``), the parent
    (the header's ``prev_hash`` is the manifest's ``last_hash``) and the state root (the manifest's ``root``
    names the header's ``state_root``, which :func:`restore` recomputes from the entries). What no header binds
    — the chunk ids and the entry counts — is bounded instead: 1 to ``max_chunks`` distinct ids, and no more
    chunks than entries (each chunk holds at least one). Pure: costs O(chunks), reads nothing.

    Raises:
        SnapshotError: any of these does not hold (the message says which).
    """
    if manifest.chain_id != chain_id or header.chain_id != chain_id:  # signing domains: chain id and genesis hash
        other = manifest.chain_id if manifest.chain_id != chain_id else header.chain_id
        raise SnapshotError(mismatch(other, chain_id, "snapshot"))
    if header.height != manifest.height + 1:
        raise SnapshotError(f"header {header.height} does not commit to the state after block {manifest.height}")
    if header.prev_hash != manifest.last_hash:
        raise SnapshotError("the header's parent is not the snapshot's block")
    if Root.from_bytes(manifest.root).hash != header.state_root:  # 40 bytes: checked by Manifest.from_wire
        raise SnapshotError("the manifest names another state root than its header")
    n = len(manifest.chunks)
    if not 1 <= n <= max_chunks:
        raise SnapshotError(f"a manifest of {n} chunks (1 to {max_chunks} accepted)")
    if n > sum(manifest.counts):
        raise SnapshotError(f"{n} chunks for {sum(manifest.counts)} entries")
    if len(set(manifest.chunks)) != n:
        raise SnapshotError("a chunk id is listed twice (no two chunks of a snapshot are alike)")


def restore(store: Any, manifest: Manifest, chunks: Sequence[bytes], header: Header, commit: Any,
            validators: tuple[bytes, ...] | ValidatorSet) -> State:
    """Install a snapshot into an empty ``store`` (:class:`node.ledger.store.LedgerStore`) after checking it
    against ``header`` (height ``manifest.height + 1``, :func:`check_manifest`) and its ``commit``; returns the
    restored state. ``chunks``: the chunks' bytes in manifest order, a list or anything indexable that reads
    them on demand (:class:`node.ledger.snapstore.ChunkSpool`: one chunk in memory at a time). The entries and
    the tree are built in memory before the root check: memory ~ 2x the snapshot's bytes, which callers bound
    (:class:`node.ledger.statesync.SyncLimits`).

    Raises:
        SnapshotError: the store is not empty, a chunk or the manifest does not check out (nothing is written).
        InvalidBlock: the header's commit is not > 2/3 of ``validators`` (the set that signed it: the genesis
            validators, or the set a :class:`node.ledger.proofs.LightClient` reached,
            :mod:`node.ledger.core.valset`).
    """
    if store.head != 0 or store.base != 0:
        raise SnapshotError("state sync installs into an empty ledger only")
    check_manifest(manifest, header, store.genesis.domain)
    verify_header(header, commit, validators)
    if len(chunks) != len(manifest.chunks):
        raise SnapshotError(f"{len(chunks)} chunks for a manifest of {len(manifest.chunks)}")
    counts = [0] * len(TABLES)
    entries: list[tuple[str, bytes, bytes]] = []
    changes: dict[bytes, bytes | None] = {}
    prev = None
    for i, data in enumerate(chunks):
        rows = check_chunk(manifest, i, data)
        if prev is not None and (rows[0][0], rows[0][1]) <= prev:
            raise SnapshotError(f"chunk {i}: entries out of order")
        prev = (rows[-1][0], rows[-1][1])
        for t, k, raw in rows:
            name = TABLES[t]
            entries.append((name, k, raw))
            changes[tr.entry_key(name, k)] = tr.leaf_value(raw)  # the root binds the stored bytes themselves
            counts[t] += 1
    if tuple(counts) != manifest.counts:
        raise SnapshotError("the entries do not match the manifest's counts")
    changes[tr.SEQ_KEY] = tr.leaf_value(pack(manifest.seq))
    tree = tr.memory_tree()
    root = tree.compute(EMPTY_ROOT, manifest.height, changes)
    if root.hash != header.state_root:
        raise SnapshotError("the snapshot's entries do not give the header's state root: refused")
    store.install_snapshot(entries, tree, manifest.height, manifest.last_hash, manifest.seq,
                           dict(zip(TABLES, counts, strict=True)))
    state: State = store.replay()
    store.note_valsets(state)  # the sets of the heights around the base, whose blocks are absent
    return state


__all__ = [
    "CHUNK_BYTES",
    "Manifest",
    "SnapshotError",
    "check_chunk",
    "check_manifest",
    "chunk_id",
    "make",
    "restore",
]
