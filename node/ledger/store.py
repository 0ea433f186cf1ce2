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
  ``i/k`` + block hash                         height (8 BE)
  ``i/a`` + account + height (8) + seq (4)     one history event of the account (a map, see :func:`index_block`)
  ``i/r`` + account + height (8) + receipt id  the account's role in that receipt: worker, requester, committee

A block, every state key it changes and every index key are written in one ``WriteBatch(sync=True)``: after a
crash at any point each block is whole or absent, and the stored state is the state after the stored head. On
open the node reads that state (:meth:`LedgerStore.replay` replays nothing then, however long the chain); a
store without one (written by an older version) is replayed from genesis once and its state written.
:meth:`LedgerStore.verify` re-checks every block from genesis through the same checks as a block from the
network (:func:`node.ledger.core.chain.check_and_apply`) and compares the result with the stored state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plyvel

from ..encoding import pack, unpack
from . import statedb
from .core import blockcodec
from .core.block import Block, decode_block
from .core.chain import check_and_apply
from .genesis import Genesis
from .core.state import FINAL, State, genesis_state


class StoreLocked(RuntimeError):
    """Another process owns this ledger directory."""


class StoreCorrupt(RuntimeError):
    """The stored chain does not verify from genesis."""


def _h(height: int) -> bytes:
    return height.to_bytes(8, "big")


INDEX_VERSION = 1
# tx fields naming accounts (a run's aggregator and worker before the ``sender`` property that aliases them)
_PARTIES = ("aggregator", "worker", "sponsor", "sender", "recipient", "requester", "voter", "validator")


def index_block(block: Block, old: State, new: State) -> list[tuple[bytes, bytes]]:
    """The ``i/`` index entries of ``block`` (applied to ``old`` giving ``new``), as ``(key, value)`` pairs.

    History events (maps with bytes values): ``{"k": tx kind, "tx": id, "role": field, "amount"?}`` for every
    account a transaction names; ``{"k": "payout" | "refund" | "paid" | "slash", "receipt": id, "amount"}`` when a
    receipt becomes final in this block (``paid``: the requester's escrow spent on it).
    """
    hb = _h(block.height)
    out: list[tuple[bytes, bytes]] = [(b"i/k" + block.hash, hb)]
    seq = 0

    def event(account: bytes, ev: dict) -> None:
        nonlocal seq
        out.append((b"i/a" + account + hb + seq.to_bytes(4, "big"), pack(ev)))
        seq += 1

    changed = list(old.open_receipts)
    for i, tx in enumerate(block.txs):
        out.append((b"i/t" + tx.id, pack([block.height, i, tx.KIND])))
        amount = getattr(tx, "amount", None) or getattr(tx, "price", None)
        if getattr(tx, "key", None) in new.evidence:
            amount = new.evidence[tx.key][1]
        parties: dict[bytes, str] = {}
        for f in _PARTIES:
            a = getattr(tx, f, None)
            if isinstance(a, bytes) and len(a) == 32:
                parties.setdefault(a, f)
        for a, role in parties.items():
            event(a, {"k": tx.KIND, "tx": tx.id, "role": role, **({"amount": amount} if amount else {})})
        if tx.id in new.receipts and tx.id not in old.receipts:
            changed.append(tx.id)
    for rid in changed:
        rec, prev = new.receipts.get(rid), old.receipts.get(rid)
        if rec is None or rec is prev:
            continue
        r = rec.receipt
        roles = {} if prev is not None else {r.worker: "worker", r.requester: "requester"}
        for m in rec.committee:
            if prev is None or m not in prev.committee:
                roles[m] = "committee"
        for a, role in roles.items():
            out.append((b"i/r" + a + _h(rec.height) + rid, pack(role)))
        if rec.status in FINAL and (prev is None or prev.status not in FINAL):
            event(r.requester, {"k": "paid", "receipt": rid, "amount": r.price})
            for a, amt in rec.payouts:
                event(a, {"k": "refund" if a == r.requester else "payout", "receipt": rid, "amount": amt})
            if rec.slashed:
                event(r.worker, {"k": "slash", "receipt": rid, "amount": rec.slashed})
    return out


class LedgerStore:
    """Single-owner LevelDB ledger at ``path`` for chain ``genesis``.

    Raises:
        StoreLocked: another process holds the database lock (never retried in-process: plyvel releases the
            lock of a failed second open).
        StoreCorrupt: the store belongs to another genesis.
    """

    def __init__(self, path: Path, genesis: Genesis):
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.db = plyvel.DB(str(path), create_if_missing=True)
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

    def close(self) -> None:
        if not self.db.closed:
            self.db.close()

    @property
    def head(self) -> int:
        v = self.db.get(b"H")
        return int.from_bytes(v, "big") if v else 0

    @property
    def base(self) -> int:
        """The height of the snapshot this ledger was state-synced from (0: it holds every block)."""
        v = self.db.get(b"base")
        return int.from_bytes(v, "big") if v else 0

    def install_snapshot(self, entries: list[tuple[str, bytes, bytes]], tree: Any, height: int, last_hash: bytes,
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
            wb.put(b"base", _h(height))
            wb.put(b"H", _h(height))
            wb.put(b"i/h", pack([height, INDEX_VERSION, 0, 0]))

    def get_block(self, height: int) -> tuple[Block, list] | None:
        d = self.get_block_raw(height)
        if d is None:
            return None
        return decode_block(d["b"]), d["c"]

    def get_block_raw(self, height: int) -> dict | None:
        """The wire dict ``{"b": block wire, "c": commit}`` of the block at ``height``, or None.

        Raises:
            blockcodec.RecordError: a malformed stored record.
        """
        raw = self.db.get(b"B" + _h(height))
        return None if raw is None else self.expand_record(height, raw)

    def expand_record(self, height: int, raw: bytes) -> dict:
        """The wire dict of ``raw``, the stored record of the block at ``height`` (either format).

        Raises:
            blockcodec.RecordError: malformed.
        """
        return blockcodec.decode_record(raw, self.genesis.chain_id, self.genesis.validators,
                                        lambda: self._commit_at(height - 1))

    def _commit_at(self, height: int) -> list:
        """The commit stored with the block at ``height`` as wire lists (empty at 0 or when absent)."""
        raw = self.db.get(b"B" + _h(height)) if height >= 1 else None
        return [] if raw is None else blockcodec.record_commit(raw, self.genesis.validators)

    def get_receipt(self, rid: bytes) -> dict | None:
        """The stored record of receipt ``rid`` (:meth:`ReceiptRecord.to_dict`), or None."""
        raw = self.db.get(statedb.PREFIX["receipts"] + rid)
        return None if raw is None else statedb.CODECS["receipts"].loads(raw).to_dict()

    def get_account(self, account: bytes) -> list[int] | None:
        """The stored ``Account.to_list()`` of ``account``, or None."""
        raw = self.db.get(statedb.PREFIX["accounts"] + account)
        return None if raw is None else statedb.CODECS["accounts"].loads(raw).to_list()

    def append(self, block: Block, commit, old: State, new: State) -> None:
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
        blob = blockcodec.encode_record(block.to_wire(), commit, self._commit_at(block.height - 1),
                                        self.genesis.chain_id, self.genesis.validators)
        meta = self.index_meta()
        index = index_block(block, old, new)  # before the commit below: it reads ``old``
        with self.db.write_batch(sync=True) as wb:
            wb.put(b"B" + _h(block.height), blob)
            self._write_index(wb, block, index, len(blob), meta)
            statedb.stage_state(wb, old, new)
            wb.put(b"H", _h(block.height))
        statedb.settle_state(new)
        self.parent_state = old

    def _write_index(self, wb, block: Block, index: list[tuple[bytes, bytes]], nbytes: int,
                     meta: list[int]) -> list[int]:
        for k, v in index:
            wb.put(k, v)
        meta = [block.height, INDEX_VERSION, meta[2] + nbytes, meta[3] + len(block.txs)]
        wb.put(b"i/h", pack(meta))
        return meta

    # ---------------------------------------------------------------- explorer index reads

    def index_meta(self) -> list[int]:
        """``[indexed height, index version, stored block bytes, transactions]`` (zeros before any block)."""
        raw = self.db.get(b"i/h")
        return unpack(raw) if raw is not None else [0, INDEX_VERSION, 0, 0]

    def tx_location(self, tx_id: bytes) -> tuple[int, int, str] | None:
        """``(height, position, kind)`` of a stored transaction, or None."""
        raw = self.db.get(b"i/t" + tx_id)
        return None if raw is None else tuple(unpack(raw))  # type: ignore[return-value]

    def height_of_hash(self, block_hash: bytes) -> int | None:
        raw = self.db.get(b"i/k" + block_hash)
        return None if raw is None else int.from_bytes(raw, "big")

    def _page(self, prefix: bytes, limit: int, cursor: bytes | None):
        """Newest-first entries under ``prefix`` strictly before the key suffix ``cursor``; returns
        ``([(suffix, value)], next cursor or None)``."""
        it = (self.db.iterator(start=prefix, stop=prefix + cursor, reverse=True) if cursor
              else self.db.iterator(prefix=prefix, reverse=True))
        items = []
        with it:
            for k, v in it:
                if len(items) == limit:
                    return items, items[-1][0]
                items.append((k[len(prefix):], v))
        return items, None

    def history(self, account: bytes, limit: int, cursor: bytes | None = None):
        """An account's history events, newest first: ``([(height, seq, event)], next cursor)``."""
        items, nxt = self._page(b"i/a" + account, limit, cursor)
        return [(int.from_bytes(s[:8], "big"), int.from_bytes(s[8:12], "big"), unpack(v)) for s, v in items], nxt

    def account_receipts(self, account: bytes, limit: int, cursor: bytes | None = None):
        """Receipts naming an account (worker, requester, committee member), newest inclusion first:
        ``([(inclusion height, receipt id, role)], next cursor)``."""
        items, nxt = self._page(b"i/r" + account, limit, cursor)
        return [(int.from_bytes(s[:8], "big"), s[8:], unpack(v)) for s, v in items], nxt

    def replay(self, progress=None) -> State:
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

    def _replay_from_genesis(self, progress=None, reindex: bool = False) -> State:
        """The state after the head, recomputed from genesis in memory through every block's checks; rewrites
        the explorer indexes on the way when ``reindex``.

        Raises:
            StoreCorrupt: a stored block is missing or does not verify, or the ledger was state-synced (the
                blocks below its base are absent).
        """
        if self.base:
            raise StoreCorrupt(f"this ledger was state-synced from a snapshot at height {self.base}: the blocks "
                               "below it are absent, so it cannot be replayed from genesis")
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
                meta = self._write_index(wb, block, index_block(block, state, new),
                                         len(self.db.get(b"B" + _h(h))), meta)
                if h % 256 == 0 or h == self.head:
                    wb.write()
                    wb = self.db.write_batch(sync=True)
            state = new
            if progress:
                progress(h)
        return state

    def verify(self, progress=None, repair: bool = False) -> list[str]:
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

    def last_commit(self) -> tuple:
        """The commit ``(validator, round, signature)…`` stored with the head block (empty at genesis)."""
        d = self.get_block_raw(self.head)
        return () if d is None else tuple((bytes(v), int(r), bytes(s)) for v, r, s in d["c"])
