"""Committee checks of tab receipts: a drawn receipt's reveal and a requester's dispute (pure; issue 37).

A revealed or disputed :class:`~.tabtx.TabReceipt` enters the receipts table as a pending receipt of kind
:class:`TabReceiptKind`: always sampled, so a committee re-executes it and votes exactly as on any receipt
(:mod:`node.ledger.core.receipts`). Its verdict comes back here (:func:`decided`).

**Disputes** (DESIGN.md "Settlement": "a requester may still dispute any receipt it holds within the window").
A requester that holds a co-signed receipt of its tab sends :class:`~.tabtx.TabDispute` naming the worker's batch
that redeemed it (the batch's payment for the receipt's tab covers its tab nonce), while that batch is not final:
drawing, revealing, checking, or in its settle window. It deposits the fee a committee gets for one drawn receipt
(``amount / m × committee_fee_bps / 10^4``, :func:`dispute_deposit`; held in its escrow): the loser pays. The
receipt is then before a committee; the batch is not paid while a dispute of it is open (its payment waits for the
verdict). **Valid** (or no quorum): the deposit pays the committee's agreeing members, the rest returns. **Invalid**:
the deposit returns, the batch is refuted (its amount back to its tabs) and the worker slashed, as for an invalid
revealed receipt. A disputed receipt that the draw then picks is revealed against the dispute's verdict (not checked
twice); a receipt revealed already is refused (it is before a committee). Once per receipt (its id).
"""

from __future__ import annotations

from typing import Any

from .. import history as history_mod
from ..genesis import TREASURY
from ..module import Payouts, admit_receipt
from ..rows import ReceiptRecord, evolve
from ..sampling import PPM
from ..status import INVALID_S
from ..txbase import INVALID, VALID, InvalidTx, Tx, Verdict, _check
from ..view import StateView
from .rules import (
    _enabled,
    _final,
    _move_escrow,
    _refund,
    after_verdict,
    apply_batch,
    apply_close,
    apply_open,
    apply_reveal,
    apply_topup,
    draw_count,
    redeems,
)
from .state import DisputeHold, Settlement
from .tabtx import EpochBatch, Reveal, TabClose, TabDispute, TabOpen, TabReceipt, TabTopUp


def dispute_deposit(s: StateView, st: Settlement) -> int:
    """What a dispute of a receipt of batch ``st`` deposits (base units): the committee fee of one drawn
    receipt, ``amount // m × committee_fee_bps // 10^4`` with ``m`` the batch's draw size."""
    m = len(st.draw) or draw_count(s, st)
    return st.amount // max(1, m) * s.params.committee_fee_bps // 10_000


def apply_dispute(s: StateView, d: TabDispute) -> None:
    """Put the requester's receipt before a committee and hold its deposit (see the module docstring).

    Raises:
        InvalidTx: tabs off; an unknown batch or one already final; a receipt of another requester or worker, or
            one the batch did not redeem (its tab is not among the batch's payments, or its tab nonce is outside
            the redeemed range); a receipt already disputed, revealed or on the ledger; a balance below the
            deposit. ``s`` is unchanged then.
    """
    _enabled(s)
    st: Settlement | None = s.tables["settlements"].get(d.batch_key)
    _check(st is not None, "unknown batch, or its window closed (it is paid, forfeited or refuted)")
    assert st is not None
    r = d.tab_receipt
    _check(r.requester == d.sender, "only the receipt's requester may dispute it")
    _check(r.worker == st.worker, "the receipt is another worker's than the batch's")
    _check(redeems(st, r.tab_id, r.tab_nonce),
           "this batch did not redeem the receipt (its tab nonce is outside the batch's voucher range)")
    _check(r.id not in s.tables["tab_disputes"], "receipt already disputed (counted once)")
    _check(r.id not in s.tables["tab_reveals"], "the receipt was drawn and revealed: it is before a committee already")
    deposit = dispute_deposit(s, st)
    _check(s.account(d.sender).balance >= deposit, f"insufficient balance for the dispute's deposit of {deposit}")
    admit_receipt(s, r)  # refuses a receipt already on the ledger
    _move_escrow(s, d.sender, -deposit, deposit)
    s.tables["tab_disputes"][r.id] = DisputeHold(batch_key=d.batch_key, requester=d.sender, deposit=deposit)
    s.tables["settlements"][d.batch_key] = evolve(st, disputes=st.disputes + 1)


def decided(s: StateView, r: Any, invalid: bool, height: int) -> None:
    """A revealed or disputed receipt has its verdict (``invalid``) or settled without one: the deposit's rest
    returns, and the batch counts it (an invalid one refutes it)."""
    hold: DisputeHold | None = s.tables["tab_disputes"].pop(r.id, None)
    key = s.tables["tab_reveals"].pop(r.id, None)
    if hold is not None and hold.deposit:
        _move_escrow(s, hold.requester, hold.deposit, -hold.deposit)
    bkey = key if key is not None else hold.batch_key if hold is not None else None
    st: Settlement | None = s.tables["settlements"].get(bkey) if bkey is not None else None
    if st is None:
        return  # its batch is already final (forfeited, or refuted by another receipt)
    assert bkey is not None
    if invalid:
        _refund(s, st)
        _final(s, bkey, st)
        return
    st = evolve(st, decided=st.decided + (key is not None), disputes=st.disputes - (hold is not None))
    s.tables["settlements"][bkey] = after_verdict(s, bkey, st, height)


class TabReceiptKind:
    """The :class:`~node.ledger.core.module.ReceiptKind` of a revealed or disputed :class:`~.tabtx.TabReceipt`:
    always sampled; the core's payouts are zero (its price is 0), so committee fees come from the batch for a
    revealed receipt (each agreeing member gets ``committee_fee_bps`` of the batch's amount per drawn receipt,
    split; on an invalid verdict the same share of the slash instead of the treasury) and from the requester's
    deposit for a disputed one that is valid."""

    def sampled_later(self, rec: ReceiptRecord) -> bool:
        return False

    def sample_ppm(self, s: StateView, r: Any, ppm: int) -> int:
        return PPM

    def split(self, s: StateView, r: Any, verdict: Verdict, payouts: Payouts) -> tuple[Payouts, int]:
        key = s.tables["tab_reveals"].get(r.id)
        hold: DisputeHold | None = s.tables["tab_disputes"].get(r.id)
        voters = [a for a, _amt in payouts if a not in (r.worker, r.requester, TREASURY)]
        if not voters:
            return payouts, 0
        st: Settlement | None = s.tables["settlements"].get(key) if key is not None else None
        if st is None and hold is not None:  # disputed, not revealed: the deposit is the fee
            if verdict == VALID:
                share = hold.deposit // len(voters)
                _move_escrow(s, hold.requester, 0, -share * len(voters))  # the core credits the members
                s.tables["tab_disputes"][r.id] = evolve(hold, deposit=hold.deposit - share * len(voters))
                return [(a, share) for a in voters], 0
            fee = hold.deposit
        elif st is None:
            return payouts, 0
        else:
            assert key is not None
            fee = st.amount // max(1, len(st.draw)) * s.params.committee_fee_bps // 10_000
            if verdict == VALID:
                fee = min(fee, st.amount)
                s.tables["settlements"][key] = evolve(st, amount=st.amount - fee)
                _move_escrow(s, st.worker, 0, -fee)  # the core credits the members' balances with these payouts
                share = fee // len(voters)
                return [(a, share) for a in voters], 0
        slashed = sum(amt for a, amt in payouts if a == TREASURY)
        share = min(fee, slashed) // len(voters)
        return [(a, share) for a in voters] + [(TREASURY, slashed - share * len(voters))], 0

    def finalized(self, s: StateView, r: Any, verdict: Verdict, owed: int, height: int) -> None:
        decided(s, r, verdict == INVALID, height)

    def owner_final(self, s: StateView, r: Any) -> int | None:
        return None  # an inference receipt: it leaves by its opened height

    def settle_unchecked(self, s: StateView, rec: ReceiptRecord, status: str, height: int) -> bool:
        s.receipts[rec.receipt.id] = evolve(rec, status=status, final_height=height, payouts=())
        s.open_receipts.pop(rec.receipt.id, None)
        history_mod.schedule_leave(s, s.receipts[rec.receipt.id], self)
        decided(s, rec.receipt, status == INVALID_S, height)
        return True


def apply_tab_tx(s: StateView, tx: Tx) -> None:
    """Dispatch one of the module's transactions.

    Raises:
        InvalidTx: as each kind's rule, or a bare :class:`~.tabtx.TabReceipt` (it enters only in a batch, a
            reveal or a dispute).
    """
    if isinstance(tx, TabOpen):
        apply_open(s, tx)
    elif isinstance(tx, TabTopUp):
        apply_topup(s, tx)
    elif isinstance(tx, TabClose):
        apply_close(s, tx)
    elif isinstance(tx, EpochBatch):
        apply_batch(s, tx)
    elif isinstance(tx, Reveal):
        apply_reveal(s, tx)
    elif isinstance(tx, TabDispute):
        apply_dispute(s, tx)
    elif isinstance(tx, TabReceipt):
        raise InvalidTx("a tab receipt enters the ledger inside an epoch batch (as a voucher), a reveal or a "
                        "dispute, not alone")
    else:  # pragma: no cover - the dispatch sends this module its own kinds only
        raise InvalidTx(f"not a tabs transaction: {tx.KIND}")


__all__ = ["TabReceiptKind", "apply_dispute", "apply_tab_tx", "decided", "dispute_deposit"]
