"""The LevelDB store (plyvel): append-only blocks plus derived indexes, one owner process.

Keys (all values msgpack):
  ``G``                    genesis hash (a store belongs to one chain)
  ``H``                    head height, 8 bytes big-endian
  ``B`` + height (8 BE)    the block and its commit, :mod:`node.ledger.core.blockcodec` format 2 (older stores:
                           ``{"b": block wire, "c": commit}``); :meth:`LedgerStore.get_block_raw` reads both
  ``S/...``                the state after the head block, flat keys per table (:mod:`node.ledger.statedb`):
                           accounts, receipt records (summary, status, committee, votes, payouts — never
                           tensors), sessions, jobs, runs, evidence, the open sets

Explorer indexes (derived, prefix ``i/``; written with each block, rebuilt by :meth:`LedgerStore.replay` from the
blocks whenever ``i/h`` does not name the head and the current index version):
  ``i/h``                                      ``[indexed height, version, stored block bytes, txs]``
  ``i/t`` + tx id                              ``[height, position in the block, kind]``
  ``i/e`` + batch key (+ ``f``, + ``d`` + index)  an epoch batch's transaction id, fate, revealed receipts
  ``i/k`` + block hash                         height (8 BE)
  ``i/a`` + account + height (8) + seq (4)     one history event of the account (a map:
                                               :mod:`node.ledger.explorer_index`)
  ``i/r`` + account + height (8) + receipt id  the account's role in that receipt: worker, requester, committee
  ``i/v`` + height (8)                         the validator set from that height on, written when it changes
                                               (:mod:`node.ledger.core.valset`, :meth:`LedgerStore.valset_at`)

History log (:mod:`node.ledger.core.history`; its head is in the state, these serve its proofs):
  ``X/l`` + index (8 BE)                       the leaf data (summary) of a receipt that left the state
  ``X/r`` + receipt id                         ``[index, height at whose end it left]``
  ``X/n`` + level (1) + index (8 BE)           the hash of a perfect subtree of the log (level 0: leaf hashes)

A block, every state key it changes and every index key are written in one ``WriteBatch(sync=True)``: after a
crash at any point each block is whole or absent, and the stored state is the state after the stored head. On
open the node reads that state (:meth:`LedgerStore.replay` replays nothing then, however long the chain); a
store without one (written by an older version) is replayed from genesis once and its state written.
:meth:`LedgerStore.verify` re-checks every block from genesis through the same checks as a block from the
network (:func:`node.ledger.core.chain.check_and_apply`) and compares the result with the stored state.

This module writes (blocks, state, indexes, the history log), opens, replays and verifies; the reads of the
indexes, the history log and stored records are :mod:`node.ledger.store_reads`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import plyvel

from ..encoding import pack, unpack_local
from . import statedb
from .core import blockcodec, domain
from .core.block import Block, decode_block
from .core.chain import check_and_apply, paused_gc
from .core.history import HEAD_KEY, Append, LogHead
from .core.records import CODECS
from .core.state import State, genesis_state
from .core.tree import StateTree
from .core.valset import ValidatorSet
from .explorer_index import INDEX_VERSION, VALSET_PREFIX, _h, index_block
from .genesis import Genesis
from .leveldb_reads import prefer_pread
from .store_reads import StoreReads, WriteBatch

READ_MODE = prefer_pread()  # at import, so before any database of this process opens (node/ledger/leveldb_reads.py)


class StoreLocked(RuntimeError):
    """Another process owns this ledger directory."""


class StoreCorrupt(RuntimeError):
    """The stored chain does not verify from genesis."""


class BodiesPruned(StoreCorrupt):
    """The block bodies needed (to replay or re-verify from genesis, or to serve) were pruned here."""


PRUNE_PER_BLOCK = 64  # old bodies one append deletes at most (a store pruned for the first time catches up)

# LevelDB compresses each table block it writes (Snappy by default), in its background thread at every memtable
# flush and compaction. The ledger's bytes are mostly hashes, signatures and keys (incompressible), and LevelDB
# stores a block uncompressed anyway when Snappy saves under 12.5 %; the attempt still cost ~0.5 x 10^9
# instructions per 500-receipt block (callgrind, bench/ledger_rate.py's blocks at 10^4 live receipts: ~20 % of the
# block's work), CPU taken from the block on a 2-core validator: process CPU per block 468 -> 283-302 ms, median
# of 10 blocks, two runs each (issue 27). The cost: a compacted store of real blocks is ~1/3 larger on disk (7.8
# -> 10.5 MB for 24 blocks of 100 receipts). Tables written before stay compressed and are read as they are.
COMPRESSION = None


class LedgerStore(StoreReads):
    """Single-owner LevelDB ledger at ``path`` for chain ``genesis``.

    ``prune_bodies``: keep the bodies (transactions) of the last N blocks only (0: every one). Older bodies are
    deleted in the batch of a later block (at most :data:`PRUNE_PER_BLOCK` per block); every header and commit
    stays, and ``P`` records :attr:`pruned_below`.

    The reads of the explorer indexes, the history log and stored records are :class:`~node.ledger.store_reads.
    StoreReads`'.

    Raises:
        StoreLocked: another process holds the database lock (never retried in-process: plyvel releases the
            lock of a failed second open).
        StoreCorrupt: the store belongs to another genesis.
        ValueError: ``prune_bodies`` is negative.
    """

    def __init__(self, path: Path, genesis: Genesis, prune_bodies: int = 0) -> None:
        if not isinstance(prune_bodies, int) or prune_bodies < 0:
            raise ValueError(f"prune_bodies must be a whole number of blocks >= 0 (0: keep every body), got "
                             f"{prune_bodies!r}")
        self.prune_bodies = prune_bodies
        path.mkdir(parents=True, exist_ok=True)
        self.read_mode = READ_MODE
        try:
            self.db = plyvel.DB(str(path), create_if_missing=True, compression=COMPRESSION)
        except plyvel.IOError as e:
            detail = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
            raise StoreLocked(f"ledger {path} is in use by another process (one node per data dir): {detail}") from None
        self.genesis = genesis
        g = self.db.get(b"G")
        if g is None:
            self.db.put(b"G", genesis.hash, sync=True)
        elif g != genesis.hash:
            self.db.close()
            raise StoreCorrupt(f"ledger {path} belongs to another genesis; use another --data-dir")
        self._check_signing_domain(path)

    def _check_signing_domain(self, path: Path) -> None:
        """Mark a store whose blocks are signed over the genesis-bound domain (key ``D``,
        :data:`node.ledger.core.domain.STORE_VERSION`); refuse one written before (blocks signed over the bare
        chain id, which no longer verify). An empty store (no block yet) is marked and used.

        Raises:
            StoreCorrupt: a store with blocks and no mark, with the command that starts the node over.
        """
        d = self.db.get(b"D")
        if d == domain.STORE_VERSION:
            return
        if d is None and self.db.get(b"H") is None:
            self.db.put(b"D", domain.STORE_VERSION, sync=True)
            return
        self.db.close()
        raise StoreCorrupt(
            f"ledger {path} was written by an older version whose signatures bind the chain id only; this version "
            "binds every signature to the genesis hash and cannot verify those blocks. A devnet restarts from its "
            f"genesis: move its ledger (and snapshots, if any) aside with `cd {path.parent} && mv {path.name} "
            f"{path.name}.old; mv snapshots snapshots.old` and start the node again; its keys stay.")

    def close(self) -> None:
        """Close the database (a second close is a no-op)."""
        if not self.db.closed:
            self.db.close()

    @property
    def head(self) -> int:
        """The height of the last stored block (0: none yet)."""
        v = self.db.get(b"H")
        return int.from_bytes(v, "big") if v else 0

    @property
    def base(self) -> int:
        """The height of the snapshot this ledger was state-synced from (0: it holds every block)."""
        v = self.db.get(b"base")
        return int.from_bytes(v, "big") if v else 0

    @property
    def pruned_below(self) -> int:
        """The lowest height whose block body this store holds when some are not held (pruned with
        ``prune_bodies``, or below a state-synced base); 0 when it holds every body from block 1."""
        v = self.db.get(b"P")
        pruned = int.from_bytes(v, "big") if v else 0
        base = self.base
        return max(pruned, base + 1 if base else 0)

    def _prune(self, wb: WriteBatch, height: int) -> None:
        """Delete, in ``wb``, the bodies (transactions) of blocks older than the last ``prune_bodies`` as of block
        ``height``: their records keep the header (with its tx root) and the commits."""
        keep_from = height - self.prune_bodies + 1
        low = max(self.pruned_below, 1)
        if keep_from <= low:
            return
        stop = min(keep_from, low + PRUNE_PER_BLOCK)
        for h in range(low, stop):
            raw = self.db.get(b"B" + _h(h))
            if raw is None:
                continue
            obj = unpack_local(raw)
            if isinstance(obj, dict) and obj.get("b", {}).get("txs"):  # legacy record
                obj["b"]["txs"] = []
                wb.put(b"B" + _h(h), pack(obj))
            elif isinstance(obj, list) and len(obj) == 5 and obj[2]:  # format 2: the tx root is stored explicitly
                wb.put(b"B" + _h(h), pack([obj[0], obj[1], [], obj[3], obj[4]]))
        wb.put(b"P", _h(stop))

    def install_snapshot(self, entries: list[tuple[str, bytes, bytes]], tree: StateTree, height: int, last_hash: bytes,
                         seq: int, counts: dict[str, int]) -> None:
        """Write a checked snapshot (:func:`node.ledger.snapshot.restore` checks it) into this empty store as
        its head and base, in one batch: ``entries`` ``(table, key, stored bytes)``, the state ``tree`` built
        from them. The blocks below the base stay absent.

        Raises:
            ValueError: the store is not empty.
        """
        if self.head != 0 or self.base != 0:
            raise ValueError("a snapshot installs into an empty ledger only")
        with self.db.write_batch(sync=True) as wb:
            statedb.write_raw(self.db, wb, entries, tree, height, last_hash, seq, counts)
            for name, k, raw in entries:
                if name == "history" and k == HEAD_KEY:  # the log's frontier: later appends' proofs need it
                    self._seed_history(wb, LogHead.from_plain(CODECS["history"].loads(raw)))
            wb.put(b"base", _h(height))
            wb.put(b"H", _h(height))
            wb.put(b"i/h", pack([height, INDEX_VERSION, 0, 0]))

    def get_block(self, height: int) -> tuple[Block, list[Any]] | None:
        """The block at ``height`` and its commit, or None (absent, or its body pruned: :attr:`pruned_below`)."""
        d = self.get_block_raw(height)
        if d is None:
            return None
        return decode_block(d["b"]), d["c"]

    def get_block_raw(self, height: int) -> dict[Any, Any] | None:
        """The wire dict ``{"b": block wire, "c": commit}`` of the block at ``height``, or None (absent, or its
        body pruned: :meth:`get_header_raw` still reads its header and commit).

        Raises:
            blockcodec.RecordError: a malformed stored record.
        """
        if height < self.pruned_below:
            return None
        raw = self.db.get(b"B" + _h(height))
        return None if raw is None else self.expand_record(height, raw)

    def get_header_raw(self, height: int) -> dict[Any, Any] | None:
        """As :meth:`get_block_raw`, also for a block whose body was pruned: then ``"b"`` has no ``txs`` (empty)
        and the dict has ``"pruned": True`` (its header, tx root included, and commits are as stored)."""
        raw = self.db.get(b"B" + _h(height))
        if raw is None:
            return None
        d = self.expand_record(height, raw)
        return {**d, "pruned": True} if height < self.pruned_below else d

    def expand_record(self, height: int, raw: bytes) -> dict[Any, Any]:
        """The wire dict of ``raw``, the stored record of the block at ``height`` (either format).

        Raises:
            blockcodec.RecordError: malformed.
        """
        return blockcodec.decode_record(raw, self.genesis.domain, self.genesis.validators,
                                        lambda: self._commit_at(height - 1))

    def _commit_at(self, height: int) -> list[list[Any]]:
        """The commit stored with the block at ``height`` as wire lists (empty at 0 or when absent)."""
        raw = self.db.get(b"B" + _h(height)) if height >= 1 else None
        return [] if raw is None else blockcodec.record_commit(raw, self.genesis.validators)

    def valset_at(self, height: int) -> ValidatorSet:
        """The validator set that signs block ``height`` (>= 1): the last ``i/v`` entry at or below it, else the
        genesis set (:func:`~node.ledger.explorer_index.valset_entries`).

        Raises:
            KeyError: ``height`` is below this store's base (state-synced) and its set was never recorded here.
        """
        for _k, raw in self.db.iterator(start=VALSET_PREFIX, stop=VALSET_PREFIX + _h(height + 1), reverse=True):
            return ValidatorSet.from_bytes(raw)
        if self.base:
            raise KeyError(f"the validator set of height {height} is below this ledger's base ({self.base})")
        return genesis_state(self.genesis).valset()

    def note_valsets(self, state: State) -> None:
        """Record the validator sets of heights ``state.height`` .. ``state.height + 2`` (the three a state holds,
        :mod:`node.ledger.core.valset`) for :meth:`valset_at`: after a snapshot install, whose blocks below are
        absent. Nothing on a chain whose set is fixed in genesis."""
        if not state.params.min_validator_bond:
            return
        sets = (state.prev_valset(), state.valset(), state.next_valset())
        with self.db.write_batch(sync=True) as wb:
            for i, vs in enumerate(sets):
                if i == 0 or vs != sets[i - 1]:
                    wb.put(VALSET_PREFIX + _h(max(1, state.height + i)), vs.to_bytes())

    def append(self, block: Block, commit: Sequence[Sequence[Any]], old: State, new: State) -> None:
        """Write ``block`` with its ``commit``, the state changes from ``old`` (the stored head state) to
        ``new`` and the index entries, atomically and durably. Afterwards ``new`` reads the stored state and
        ``old`` (now :attr:`parent_state`) still reads as it was.

        Raises:
            ValueError: ``block`` does not follow the head, or ``new`` is not a state over this store.
        """
        if block.height != self.head + 1:
            raise ValueError(f"append of block {block.height} on head {self.head}")
        if new.height != block.height:
            raise ValueError(f"state at height {new.height} for block {block.height}")
        with paused_gc():  # the state root and the batch: ~10^5 short-lived objects (chain.paused_gc)
            self._append(block, commit, old, new)

    def _append(self, block: Block, commit: Sequence[Sequence[Any]], old: State, new: State) -> None:
        blob = blockcodec.encode_record(block.to_wire(), commit, self._commit_at(block.height - 1),
                                        self.genesis.domain, self.genesis.validators)
        meta = self.index_meta()
        index = index_block(block, old, new)  # before the commit below: it reads ``old``
        with self.db.write_batch(sync=True) as wb:
            wb.put(b"B" + _h(block.height), blob)
            self._write_index(wb, block, index, len(blob), meta)
            statedb.stage_state(wb, old, new)
            self._write_history(wb, block.height, new.archived)
            if self.prune_bodies:
                self._prune(wb, block.height)
            wb.put(b"H", _h(block.height))
        statedb.settle_state(new)
        self.parent_state = old

    @staticmethod
    def _write_history(wb: WriteBatch, height: int, archived: list[Append]) -> None:
        """The leaves and subtree hashes of the receipts that left the state in block ``height``."""
        for a in archived:
            wb.put(b"X/l" + _h(a.index), a.data)
            wb.put(b"X/r" + a.receipt_id, pack([a.index, height]))
            for level, idx, hsh in a.nodes:
                wb.put(b"X/n" + bytes([level]) + _h(idx), hsh)

    @staticmethod
    def _seed_history(wb: WriteBatch, head: LogHead) -> None:
        """Store the frontier of a restored log head as the perfect subtrees it is (largest first): the audit
        paths of every receipt that leaves after the snapshot need only these and later nodes."""
        start, hashes = 0, iter(head.frontier)
        for level in range(head.size.bit_length() - 1, -1, -1):
            if head.size >> level & 1:
                wb.put(b"X/n" + bytes([level]) + _h(start >> level), next(hashes))
                start += 1 << level

    def _write_index(self, wb: WriteBatch, block: Block, index: list[tuple[bytes, bytes]], nbytes: int,
                     meta: list[int]) -> list[int]:
        for k, v in index:
            wb.put(k, v)
        meta = [block.height, INDEX_VERSION, meta[2] + nbytes, meta[3] + len(block.txs)]
        wb.put(b"i/h", pack(meta))
        return meta

    def replay(self, progress: Callable[[int], None] | None = None) -> State:
        """Open the stored state: read it where one is stored for the head (no block is replayed), else replay
        the chain from genesis once and store the result. Rebuilds the explorer indexes from the blocks when
        they are absent, stale or were interrupted. Sets :attr:`parent_state`.

        Args:
            progress: ``fn(height)`` after each block replayed.

        Raises:
            StoreCorrupt: a stored block does not verify, or the stored state does not belong to the head.
        """
        meta = self.index_meta()
        try:
            stored = statedb.read_meta(self.db)
        except statedb.StateFormatError as e:
            raise StoreCorrupt(f"ledger state: {e}; move the data dir aside or use another --data-dir") from None
        if stored is not None and stored[0] == self.head and meta[:2] == [self.head, INDEX_VERSION]:
            state = statedb.open_state(self.db, self.genesis)
            last = self.get_block_raw(self.head)
            if last is not None and decode_block(last["b"]).hash != state.last_hash:
                raise StoreCorrupt(f"the stored state is not the state after block {self.head}")
            try:
                self.parent_state = statedb.parent_view(self.db, state)
            except statedb.StateFormatError as e:
                raise StoreCorrupt(f"ledger state: {e}") from None
            return state
        state = self._replay_from_genesis(progress, reindex=meta[:2] != [self.head, INDEX_VERSION])
        with self.db.write_batch(sync=True) as wb:
            statedb.dump_state(self.db, wb, state)
            for old_prefix in (b"A", b"R", b"I"):  # the derived keys of stores written before format 1
                for k in self.db.iterator(prefix=old_prefix, include_value=False):
                    wb.delete(k)
        return self.replay()

    def _replay_from_genesis(self, progress: Callable[[int], None] | None = None, reindex: bool = False) -> State:
        """The state after the head, recomputed from genesis in memory through every block's checks; rewrites
        the explorer indexes on the way when ``reindex``.

        Raises:
            StoreCorrupt: a stored block is missing or does not verify, or the ledger was state-synced (the
                blocks below its base are absent).
        """
        if self.base:
            raise StoreCorrupt(f"this ledger was state-synced from a snapshot at height {self.base}: the blocks "
                               "below it are absent, so it cannot be replayed from genesis")
        if self.pruned_below > 1:
            raise BodiesPruned(f"this ledger keeps block bodies from height {self.pruned_below} only (node start "
                               "--prune-bodies): the older transactions are deleted, so it cannot be replayed or "
                               "re-verified from genesis; verify a full node's ledger, or state-sync a new one")
        state = genesis_state(self.genesis)
        if reindex:  # rebuild the explorer indexes from the blocks (absent, stale or interrupted)
            with self.db.write_batch(sync=True) as wb:
                for k in self.db.iterator(prefix=b"i/", include_value=False):
                    wb.delete(k)
            meta = [0, INDEX_VERSION, 0, 0]
            wb = self.db.write_batch(sync=True)
        for h in range(1, self.head + 1):
            got = self.get_block(h)
            if got is None:
                raise StoreCorrupt(f"block {h} missing below head {self.head}")
            block, commit = got
            try:
                new = check_and_apply(state, block, commit)
            except ValueError as e:
                raise StoreCorrupt(f"block {h} does not verify: {e}") from None
            if reindex:
                stored = cast(bytes, self.db.get(b"B" + _h(h)))  # present: get_block(h) just read it
                meta = self._write_index(wb, block, index_block(block, state, new), len(stored), meta)
                if h % 256 == 0 or h == self.head:
                    wb.write()
                    wb = self.db.write_batch(sync=True)
            state = new
            if progress:
                progress(h)
        return state

    def verify(self, progress: Callable[[int], None] | None = None, repair: bool = False) -> list[str]:
        """Re-check every stored block from genesis and compare the result with the stored state.

        Args:
            progress: ``fn(height)`` after each block.
            repair: rewrite the stored state from the replay when they differ.

        Returns:
            Up to 10 differences found (empty: the stored state is exactly the replayed one).

        Raises:
            StoreCorrupt: a stored block is missing or does not verify (nothing is rewritten then).
        """
        replayed = self._replay_from_genesis(progress)
        stored = statedb.open_state(self.db, self.genesis) if statedb.read_meta(self.db) else None
        diffs = ["no stored state"] if stored is None else statedb.differences(replayed, stored)
        if diffs and repair:
            with self.db.write_batch(sync=True) as wb:
                statedb.dump_state(self.db, wb, replayed)
        return diffs

    def head_time_ms(self) -> int:
        """The head block's header timestamp (ms), read from its raw header without decoding the block; the
        genesis time before the first block (no block may be older than its chain)."""
        d = self.get_block_raw(self.head)
        return self.genesis.genesis_time_ms if d is None else int(d["b"]["h"][3])

    def last_commit(self) -> tuple[tuple[bytes, int, bytes], ...]:
        """The commit ``(validator, round, signature)…`` stored with the head block (empty at genesis)."""
        if self.head < self.pruned_below:  # (as get_block_raw: a body pruned, or below a state-synced base)
            return ()
        # the head's stored commit alone (blockcodec.record_commit), not its whole record decoded
        return tuple((bytes(v), int(r), bytes(s)) for v, r, s in self._commit_at(self.head))
