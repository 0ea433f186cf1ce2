"""Keeping this node's batch offer on the ledger as ``node start`` was told (issue 24 finding 2).

The ledger draws batch workers only among bonded accounts with a live
:class:`~node.ledger.core.batchtx.BatchOffer` whose floor takes the batch's price (:mod:`node.ledger.core.batch`).
``node start --accept-batches [--batch-floor PRICE]`` wants an offer at that floor (base units per token; the
genesis floor when not given); ``node start`` without the flag wants none. :class:`OfferKeeper` compares, at each
block, what the ledger holds for this account with what it wants and, when they differ and no offer of this node
is still queued in its mempool (the ledger service re-sends queued transactions itself), submits one
``BatchOffer`` (a withdrawal is ``min_price_per_token`` -1). So a node catching up on old blocks, whose state
still shows its old offer, waits for its queued one instead of sending another. An offer is sent only while the
account is bonded (an unbonded account is never drawn, and an account with no balance could not queue it); a
withdrawal is sent whatever the bond.

Items already drawn before a withdrawal are still this node's to do: the :class:`~node.batch.worker.BatchWorker`
runs on every node, so they are committed and revealed as usual.
"""

from __future__ import annotations

import logging

import trio

from ..duty.runner import DutyRunner
from ..duty.seams import Ledger
from ..identity import Identity
from ..ledger.core.batch import reputation
from ..ledger.core.batchtx import WITHDRAWN, BatchOffer
from ..ledger.core.state import State
from ..ledger.core.tx import InvalidTx

log = logging.getLogger("tally.batch")

def wanted_offer(accept: bool, floor: int | None, genesis_floor: int) -> int:
    """The ``min_price_per_token`` this node wants on the ledger: :data:`WITHDRAWN` without ``--accept-batches``,
    else ``floor`` (base units per token), or ``genesis_floor`` when no floor was given."""
    if not accept:
        return WITHDRAWN
    return genesis_floor if floor is None else floor


class OfferKeeper:
    """Submits a :class:`BatchOffer` whenever the ledger's offer for ``ident`` differs from ``want`` (module
    docstring). ``want``: base units per token, or :data:`WITHDRAWN`."""

    def __init__(self, ident: Identity, ledger: Ledger, want: int):
        self.ident, self.ledger, self.want = ident, ledger, want
        self.last: bytes | None = None  # id of the last offer sent
        self.duty_runner = DutyRunner(self, ledger, at_start=True)  # at start and after each block

    @property
    def name(self) -> str:
        """The duty's name in logs (:class:`node.duty.runner.Duty`)."""
        return "batch offer"

    def pending(self, st: State) -> BatchOffer | None:
        """The offer to send now against state ``st`` (unsigned), or None: the ledger already holds what this
        node wants, the last offer sent is still queued in the mempool, or the account is not bonded (an offer
        only; a withdrawal is always sent)."""
        me = self.ident.account
        if reputation(st, me).offer == self.want:
            return None
        if self.want != WITHDRAWN and st.account(me).bond < st.params.min_bond:
            return None
        if self.last is not None:
            try:
                self.ledger.mempool[self.last]
                return None  # still queued: included, dropped or refused first
            except KeyError:
                self.last = None
        return BatchOffer(self.ledger.chain_id, me, self.want, self.ledger.next_nonce(me))

    async def step(self, nursery: trio.Nursery | None = None) -> None:
        """Send the :meth:`pending` offer, if any (a refusal or a failed send is logged and retried later).
        ``nursery``: unused (:class:`node.duty.runner.Duty`: the offer is sent within the step)."""
        st = self.ledger.state
        tx = self.pending(st)
        if tx is None:
            return
        what = "withdrawing this node's batch offer" if self.want == WITHDRAWN else (
            f"offering to take batch items at {self.want} base units per token or more")
        signed = tx.signed(self.ident)
        try:
            self.last = signed.id  # queued by submit before it broadcasts
            await self.ledger.submit(signed)
            log.info("%s (batch_offer, nonce %d)", what, tx.nonce)
        except InvalidTx as e:  # not queued: tried again at the next block
            self.last = None
            log.warning("%s: refused by the local node (tried again at the next block): %s", what, e)
        except Exception as e:  # noqa: BLE001  (queued; gossip or a validator failing: the ledger service re-sends)
            log.info("%s: queued, not yet broadcast (%s: %s)", what, type(e).__name__, e)

    async def run(self) -> None:
        """Forever: at start and after each block, :meth:`step` (:class:`node.duty.runner.DutyRunner`)."""
        await self.duty_runner.run()


__all__ = ["OfferKeeper", "wanted_offer"]
