"""The LevelDB store (plyvel): append-only blocks plus derived indexes, one owner process.

Keys (all values msgpack):
  ``G``                    genesis hash (a store belongs to one chain)
  ``H``                    head height, 8 bytes big-endian
  ``B`` + height (8 BE)    ``{"b": block wire, "c": commit}``
  ``A`` + account          ``Account.to_list()``
  ``R`` + receipt id       receipt record (summary, status, committee, votes, payouts — never tensors)
  ``I`` + receipt id       inclusion height

A block and every derived key it changes are written in one ``WriteBatch(sync=True)``: after a crash at any
point each block is whole or absent. On open the node replays every stored block from genesis through the same
checks as a block from the network (:func:`node.ledger.chain.check_and_apply`) and compares the result with
the stored derived state, rewriting it from the replay if it differs.
"""

from __future__ import annotations

from pathlib import Path

import plyvel

from ..encoding import pack, unpack
from .block import Block, decode_block
from .chain import check_and_apply
from .genesis import Genesis
from .state import State, genesis_state


class StoreLocked(RuntimeError):
    """Another process owns this ledger directory."""


class StoreCorrupt(RuntimeError):
    """The stored chain does not verify from genesis."""


def _h(height: int) -> bytes:
    return height.to_bytes(8, "big")


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

    def get_block(self, height: int) -> tuple[Block, list] | None:
        raw = self.db.get(b"B" + _h(height))
        if raw is None:
            return None
        d = unpack(raw)
        return decode_block(d["b"]), d["c"]

    def get_block_raw(self, height: int) -> dict | None:
        raw = self.db.get(b"B" + _h(height))
        return None if raw is None else unpack(raw)

    def get_receipt(self, rid: bytes) -> dict | None:
        raw = self.db.get(b"R" + rid)
        return None if raw is None else unpack(raw)

    def get_account(self, account: bytes) -> list[int] | None:
        raw = self.db.get(b"A" + account)
        return None if raw is None else unpack(raw)

    def append(self, block: Block, commit, old: State, new: State) -> None:
        """Write ``block`` with its ``commit`` and every derived key that changed from ``old`` to ``new``,
        atomically and durably."""
        if block.height != self.head + 1:
            raise ValueError(f"append of block {block.height} on head {self.head}")
        with self.db.write_batch(sync=True) as wb:
            wb.put(b"B" + _h(block.height), pack({"b": block.to_wire(), "c": [list(x) for x in commit]}))
            self._write_derived(wb, old, new)
            wb.put(b"H", _h(block.height))

    def _write_derived(self, wb, old: State | None, new: State) -> None:
        for a, acc in new.accounts.items():
            if old is None or old.accounts.get(a) is not acc:
                wb.put(b"A" + a, pack(acc.to_list()))
        for rid, rec in new.receipts.items():
            if old is None or old.receipts.get(rid) is not rec:
                wb.put(b"R" + rid, pack(rec.to_dict()))
                wb.put(b"I" + rid, _h(rec.height))

    def replay(self, progress=None) -> State:
        """Rebuild the state from genesis by checking and applying every stored block; repair derived keys.

        Raises:
            StoreCorrupt: a stored block does not verify.
        """
        state = genesis_state(self.genesis)
        self.parent_state = state
        if self.head == 0:
            with self.db.write_batch(sync=True) as wb:
                self._write_derived(wb, None, state)
            return state
        for h in range(1, self.head + 1):
            got = self.get_block(h)
            if got is None:
                raise StoreCorrupt(f"block {h} missing below head {self.head}")
            block, commit = got
            try:
                self.parent_state = state
                state = check_and_apply(state, block, commit)
            except ValueError as e:
                raise StoreCorrupt(f"block {h} does not verify: {e}") from None
            if progress:
                progress(h)
        if not self._derived_matches(state):
            with self.db.write_batch(sync=True) as wb:
                self._write_derived(wb, None, state)
        return state

    def _derived_matches(self, state: State) -> bool:
        for a, acc in state.accounts.items():
            if self.get_account(a) != acc.to_list():
                return False
        n = sum(1 for _ in self.db.iterator(prefix=b"R", include_value=False))
        return n == len(state.receipts)

    def last_commit(self) -> tuple:
        """The commit ``(validator, round, signature)…`` stored with the head block (empty at genesis)."""
        d = self.get_block_raw(self.head)
        return () if d is None else tuple((bytes(v), int(r), bytes(s)) for v, r, s in d["c"])
