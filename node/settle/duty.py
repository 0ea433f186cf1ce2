"""The worker's settlement duty (issue 37): one epoch batch per epoch over the receipts in its book, the reveals of
what the ledger draws from it, and the book kept in step with the ledger (:mod:`node.ledger.core.tabs`).

Each :meth:`SettleDuty.step` (once per block, :class:`node.duty.runner.DutyRunner`) reads the ledger state and:

1. for every batch in the book: when the ledger holds it, marks it included and, while the ledger waits for reveals,
   submits a :class:`~node.ledger.core.tabs.Reveal` (receipt and RFC 9162 inclusion proof) for each drawn receipt not
   yet revealed; when an included batch is gone from the ledger it is final, and its receipts leave the book; a
   batch never included whose epoch can no longer be included is released (its receipts go into the next one); one
   that may still be included is sent again (the same transaction: the ledger takes it once);
2. when the ledger's epoch moved past the last epoch this worker batched and no batch of its is on its way, commits
   to every open receipt in a batch for the epoch just ended (recorded in the book before it is sent).

After a crash the book holds every receipt that was stored and every batch that was prepared, so the duty picks up
where it stopped: a receipt is covered by at most one batch at a time, and the ledger takes one batch per worker and
epoch, so nothing is paid twice.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from ..duty.seams import Ledger
from ..encoding import inclusion_proof
from ..identity import Identity
from ..ledger.core.tabs import Reveal
from ..ledger.core.tabs.rules import epoch_of
from ..ledger.core.tabs.state import SettlementStatus
from ..ledger.core.tx import InvalidTx, Tx
from .book import EpochBook

log = logging.getLogger("tally.settle")


class BlobDeleter(Protocol):
    """Where the sessions' tensors are kept (:class:`node.blobs.BlobStore`)."""

    def delete(self, key: bytes) -> bool: ...


class SettleDuty:
    """One worker's settlement (see the module docstring). ``name`` for the duty runner."""

    name = "settle"

    def __init__(self, ledger: Ledger, ident: Identity, book: EpochBook, blobs: BlobDeleter | None = None):
        self.ledger, self.ident, self.book = ledger, ident, book
        self.blobs = blobs  # where the sessions' tensors are kept: a final batch's are deleted (None: left alone)
        self.blobs_deleted = 0
        self.batches_sent = 0
        self.reveals_sent = 0

    async def _submit(self, tx: Tx) -> bool:
        if tx.id in self.ledger.mempool:
            return False
        try:
            await self.ledger.submit(tx)
            return True
        except InvalidTx as e:  # the state moved on (revealed, included) since it was read: the next step sees it
            log.info("settlement: %s not sent: %s", tx.KIND, e)
            return False

    async def step(self, nursery: trio.Nursery) -> None:
        """Bring the book and the ledger in step once (see the module docstring)."""
        s = self.ledger.state
        p = s.params
        if not p.epoch_blocks:
            return
        now = epoch_of(s.height + 1, p.epoch_blocks)
        settlements = s.tables["settlements"]
        on_its_way = False
        for key, batch, receipts, included in list(self.book.batches()):
            st = settlements.get(key)
            if st is not None:
                if not included:
                    self.book.included(key)
                if st.status == SettlementStatus.REVEALING:
                    ids = [r.id for r in receipts]
                    for i, rid in zip(st.draw, st.revealed, strict=True):
                        if not rid:
                            rv = Reveal(s.chain_id, self.ident.account, key, i, receipts[i].to_record(),
                                        inclusion_proof(ids, i)).signed(self.ident)
                            self.reveals_sent += await self._submit(rv)
            elif included:
                gone = self.book.final(key)
                if self.blobs is not None and gone:
                    roots = {x for r in gone for x in (r.inputs_root, r.outputs_root)} - self.book.blob_roots()
                    self.blobs_deleted += sum(self.blobs.delete(x) for x in roots)
                log.info("settlement: batch of epoch %d is final", batch.epoch)
            elif batch.epoch < now - 1:
                self.book.release(key)
                log.warning("settlement: batch of epoch %d was never included; its receipts go into the next",
                            batch.epoch)
            else:
                on_its_way = True
                await self._submit(batch)
        _, last = s.tables["worker_batches"].get(self.ident.account, (0, -1))
        if not on_its_way and now - 1 > last:
            made = self.book.make_batch(self.ident, now - 1)
            if made is not None:
                batch, receipts = made
                self.book.prepare(batch, receipts)
                self.batches_sent += await self._submit(batch)
                log.info("settlement: batch of epoch %d over %d receipts (%d tabs) sent", batch.epoch, batch.count,
                         len(batch.vouchers))


__all__ = ["BlobDeleter", "SettleDuty"]
