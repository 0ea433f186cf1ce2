"""A worker's epoch book: the countersigned tab receipts it holds until their epoch batch is final (issue 37).

A server paid through tabs (:mod:`node.ledger.core.tabs`) sends no transaction per receipt: it keeps every final
:class:`~node.ledger.core.tabs.TabReceipt` of a session here, on disk (LevelDB, every write synced, so a receipt
the requester signed survives a SIGKILL of the worker right after), and once per epoch commits to them in one
:class:`~node.ledger.core.tabs.EpochBatch` (:mod:`node.settle.duty`). The book is also where the receipts drawn
from a batch are revealed from, with their inclusion proofs, and they stay until the batch is final (paid,
forfeited or refuted): a stated, bounded retention. The session tensors a committee re-executes them from (the
blobs of their inputs and outputs roots, :mod:`node.blobs`) are kept as long and deleted then by the settlement
duty (:mod:`node.settle.duty`), unless a receipt still in the book names the same blob.

Layout (keys): ``r/`` ‖ tab id ‖ tab nonce (8 bytes) → the receipt's record (fields and both signatures), one per
session (a newer receipt of the same session, with more steps, replaces the older); ``b/`` ‖ batch key → the
batch's epoch, its leaves' keys in order, the batch itself and whether the ledger included it, from just before it
is sent until it is final. A receipt leaves ``r/`` when the batch
that covered it is final. Receipts not yet in a batch are the *open* ones: the next batch takes all of them, in key
order (by tab, then nonce).

Bounds: at most :data:`MAX_OPEN` open receipts (a worker past it refuses new sessions on tabs until its next batch),
each record at most 2 KiB.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import plyvel

from ..encoding import merkle_root, pack, unpack_local
from ..identity import Identity
from ..ledger.core.tabs import EpochBatch, TabReceipt
from ..ledger.core.tx import decode_tx

MAX_OPEN = 1 << 20  # open receipts one book holds (a batch commits to at most this many)
_R, _B = b"r/", b"b/"


class BookFull(RuntimeError):
    """The book holds :data:`MAX_OPEN` open receipts: no more sessions on tabs until the next batch."""


def _rkey(r: TabReceipt) -> bytes:
    return _R + r.tab_id + r.tab_nonce.to_bytes(8, "big")


class EpochBook:
    """The receipts one worker holds (see the module docstring). Opens (or creates) ``path``.

    Raises:
        plyvel.Error: the directory is held by another process (one process per LevelDB).
    """

    def __init__(self, path: Path, chain_id: str):
        path.mkdir(parents=True, exist_ok=True)
        self.db = plyvel.DB(str(path), create_if_missing=True)
        self.chain_id = chain_id
        self._batched: set[bytes] = set()  # keys of receipts a pending batch covers
        for _, v in self.db.iterator(prefix=_B):
            self._batched.update(unpack_local(v)[1])
        self._open = sum(1 for k in self.db.iterator(prefix=_R, include_value=False) if k not in self._batched)

    def close(self) -> None:
        self.db.close()

    def add(self, r: TabReceipt) -> bool:
        """Keep ``r`` (a session's final receipt, both signatures on it); True when stored. A receipt of the same tab
        and nonce with a lower or equal cumulative, or one a pending batch already covers, is not stored.

        Raises:
            BookFull: :data:`MAX_OPEN` open receipts are held.
        """
        key = _rkey(r)
        if key in self._batched:
            return False
        old = self.db.get(key)
        if old is not None and TabReceipt.from_record(self.chain_id, unpack_local(old)).cumulative >= r.cumulative:
            return False
        if old is None and self._open >= MAX_OPEN:
            raise BookFull(f"{MAX_OPEN} receipts wait for the next epoch batch")
        self.db.put(key, pack(r.to_record()), sync=True)
        self._open += old is None
        return True

    def open_receipts(self) -> list[TabReceipt]:
        """Receipts no pending batch covers, in the order the next batch commits to them."""
        return [TabReceipt.from_record(self.chain_id, unpack_local(v))
                for k, v in self.db.iterator(prefix=_R) if k not in self._batched]

    def newest(self, tab_id: bytes) -> TabReceipt | None:
        """The highest-nonce receipt this book holds for ``tab_id`` (batched or not), or None."""
        last = None
        for _, v in self.db.iterator(prefix=_R + tab_id, reverse=True):
            last = TabReceipt.from_record(self.chain_id, unpack_local(v))
            break
        return last

    def make_batch(self, ident: Identity, epoch: int) -> tuple[EpochBatch, list[TabReceipt]] | None:
        """The batch over every open receipt, signed by ``ident``, and its receipts in leaf order; None when
        none is open. Nothing is recorded until :meth:`prepare`."""
        rs = self.open_receipts()
        if not rs:
            return None
        newest: dict[bytes, TabReceipt] = {}
        for r in rs:
            newest[r.tab_id] = r  # key order: the last of a tab is its highest nonce
        b = EpochBatch(self.chain_id, ident.account, epoch, merkle_root([r.id for r in rs]), len(rs),
                       sum(r.work for r in rs), [r.to_record() for r in newest.values()]).signed(ident)
        return b, rs

    def prepare(self, batch: EpochBatch, receipts: list[TabReceipt]) -> None:
        """Record ``batch`` (over ``receipts``, in order) before it is sent: they are covered by it from now on,
        so a restart finds the batch, not a second one over the same receipts."""
        keys = [_rkey(r) for r in receipts]
        self.db.put(_B + batch.key, pack([batch.epoch, keys, batch.to_wire(), False]), sync=True)
        self._batched.update(keys)
        self._open -= len(keys)

    def included(self, batch_key: bytes) -> None:
        """The ledger holds ``batch_key``: from now on its absence there means it is final."""
        raw = self.db.get(_B + batch_key)
        if raw is not None:
            epoch, keys, wire, _ = unpack_local(raw)
            self.db.put(_B + batch_key, pack([epoch, keys, wire, True]), sync=True)

    def batches(self) -> Iterator[tuple[bytes, EpochBatch, list[TabReceipt], bool]]:
        """``(batch key, batch, receipts in leaf order, included)`` of every batch recorded and not final."""
        for k, v in self.db.iterator(prefix=_B):
            _, keys, wire, inc = unpack_local(v)
            b = decode_tx(wire)
            assert isinstance(b, EpochBatch)
            yield k[len(_B):], b, [TabReceipt.from_record(self.chain_id, unpack_local(self.db.get(x)))
                                   for x in keys], bool(inc)

    def _drop(self, batch_key: bytes, receipts_too: bool) -> list[TabReceipt]:
        raw = self.db.get(_B + batch_key)
        if raw is None:
            return []
        _, keys, _, _ = unpack_local(raw)
        gone = [TabReceipt.from_record(self.chain_id, unpack_local(v)) for x in keys
                if receipts_too and (v := self.db.get(x)) is not None]
        with self.db.write_batch(sync=True) as wb:
            if receipts_too:
                for x in keys:
                    wb.delete(x)
            wb.delete(_B + batch_key)
        self._batched.difference_update(keys)
        if not receipts_too:
            self._open += len(keys)
        return gone

    def final(self, batch_key: bytes) -> list[TabReceipt]:
        """``batch_key`` is final (paid, forfeited or refuted): its receipts and its record leave the book; the
        receipts that left (empty when the batch was not recorded)."""
        return self._drop(batch_key, True)

    def blob_roots(self) -> set[bytes]:
        """The inputs and outputs roots of every receipt still in the book (open or in a batch not final): the
        blobs a committee may still ask this worker for. O(receipts in the book)."""
        out: set[bytes] = set()
        for _, v in self.db.iterator(prefix=_R):
            r = TabReceipt.from_record(self.chain_id, unpack_local(v))
            out.update((r.inputs_root, r.outputs_root))
        return out

    def release(self, batch_key: bytes) -> None:
        """``batch_key`` was never included and no longer can be: its receipts are open again, for the next."""
        self._drop(batch_key, False)


__all__ = ["MAX_OPEN", "BookFull", "EpochBook"]
