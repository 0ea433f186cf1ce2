"""The requester's disputes: a plain receipt's at once, a tab receipt's once the batch that redeems it is on the
ledger (issue 37).

A plain :class:`~node.ledger.core.tx.Receipt` is disputed by a :class:`~node.ledger.core.disputes.Dispute` sent
at once (:meth:`DisputeDuty.dispute`): the ledger puts it before a committee at the end of the next block. A
requester that finds a receipt wrong (a redundant session whose two routes disagree, :mod:`node.inference.
redundant`) holds the co-signed :class:`~node.ledger.core.tabs.TabReceipt` at once, but the ledger can judge it
only against the worker's epoch batch that redeemed it (:mod:`node.ledger.core.tabs.checks`), which the worker
sends after the epoch ends. :class:`DisputeDuty` keeps such receipts and, at each block, looks for the batch:
the worker's batch key for each epoch from the receipt's (the session opened at ``opened_height``) to now
(:func:`~node.ledger.core.tabs.tabtx.batch_key`: the hash of worker and epoch, so no scan), one whose payment on
the receipt's tab covers its tab nonce. Found: it sends :class:`~node.ledger.core.tabs.TabDispute` and forgets the
receipt. Not found after :data:`GIVE_UP_EPOCHS` epochs: forgotten with a warning (a worker that never redeems the
receipt is never paid for it). At most :data:`MAX_QUEUED` receipts are kept (the oldest dropped first); kept in
memory only: a restart forgets them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import trio

from ..duty.seams import Ledger
from ..identity import Identity
from ..ledger.core.disputes import Dispute
from ..ledger.core.state import State
from ..ledger.core.tabs import TabDispute, TabReceipt
from ..ledger.core.tabs.rules import epoch_of, redeems
from ..ledger.core.tabs.state import Settlement
from ..ledger.core.tabs.tabtx import batch_key
from ..ledger.core.tx import InvalidTx, Receipt

log = logging.getLogger(__name__)

MAX_QUEUED = 1024  # receipts waiting for their batch
GIVE_UP_EPOCHS = 8  # epochs after the receipt's in which its batch must appear


def redeeming_batch(s: State, r: TabReceipt) -> bytes | None:
    """The key of the worker's batch, not final, whose payment on ``r``'s tab covers ``r``'s tab nonce; None when
    there is none (yet, or any more)."""
    p = s.params
    if not p.epoch_blocks:
        return None
    first = max(0, epoch_of(r.opened_height, p.epoch_blocks) - 1)
    for e in range(first, epoch_of(s.height + 1, p.epoch_blocks) + 1):
        key = batch_key(r.worker, e)
        st: Settlement | None = s.tables["settlements"].get(key)
        if st is not None and redeems(st, r.tab_id, r.tab_nonce):
            return key
    return None


class DisputeDuty:
    """The requester's queued disputes (module docstring); ``name`` for the duty runner."""

    name = "disputes"

    def __init__(self, ledger: Ledger, ident: Identity):
        self.ledger, self.ident = ledger, ident
        self.queued: OrderedDict[bytes, TabReceipt] = OrderedDict()  # receipt id -> receipt
        self.sent: list[bytes] = []  # receipt ids disputed on the ledger (newest last; bounded)

    async def dispute(self, receipt: Receipt | TabReceipt) -> None:
        """Put ``receipt`` (this requester's) before a committee: a plain receipt by a ``Dispute`` sent now, a tab
        receipt queued (:meth:`add`) until the worker's batch that redeems it is on the ledger.

        Raises:
            ValueError: ``receipt`` is another requester's. InvalidTx: the local ledger refused the dispute.
        """
        if receipt.requester != self.ident.account:
            raise ValueError("only the receipt's requester disputes it")
        if isinstance(receipt, TabReceipt):
            self.add(receipt)
            log.info("receipt %s of %s queued for a tab dispute (filed when its batch is on the ledger)",
                     receipt.id.hex()[:16], receipt.worker.hex()[:16])
            return
        await self.ledger.submit(Dispute(self.ledger.chain_id, self.ident.account, receipt.id).signed(self.ident))
        log.info("disputed receipt %s of %s", receipt.id.hex()[:16], receipt.worker.hex()[:16])

    def add(self, r: TabReceipt) -> None:
        """Dispute ``r`` (this requester's, co-signed) once its batch is on the ledger.

        Raises:
            ValueError: ``r`` is another requester's.
        """
        if r.requester != self.ident.account:
            raise ValueError("only the receipt's requester disputes it")
        self.queued[r.id] = r
        while len(self.queued) > MAX_QUEUED:
            old, _ = self.queued.popitem(last=False)
            log.warning("tab dispute of receipt %s dropped: more than %d queued", old.hex()[:16], MAX_QUEUED)

    async def step(self, nursery: trio.Nursery) -> None:
        """File each queued dispute whose batch is on the ledger; drop those past :data:`GIVE_UP_EPOCHS`."""
        s = self.ledger.state
        p = s.params
        if not p.epoch_blocks:
            return
        now = epoch_of(s.height + 1, p.epoch_blocks)
        for rid, r in list(self.queued.items()):
            key = redeeming_batch(s, r)
            if key is None:
                if now > epoch_of(r.opened_height, p.epoch_blocks) + GIVE_UP_EPOCHS:
                    del self.queued[rid]
                    log.warning("tab dispute of receipt %s given up: no batch of the worker redeemed it within %d "
                                "epochs", rid.hex()[:16], GIVE_UP_EPOCHS)
                continue
            tx = TabDispute(s.chain_id, self.ident.account, key, r.to_record()).signed(self.ident)
            try:
                await self.ledger.submit(tx)  # any other error (the network) leaves it queued for the next step
            except InvalidTx as e:
                del self.queued[rid]
                log.warning("tab dispute of receipt %s refused: %s", rid.hex()[:16], e)
                continue
            del self.queued[rid]
            self.sent = [*self.sent[-255:], rid]
            log.info("tab dispute of receipt %s sent (batch %s)", rid.hex()[:16], key.hex()[:16])


__all__ = ["GIVE_UP_EPOCHS", "MAX_QUEUED", "DisputeDuty", "redeeming_batch"]
