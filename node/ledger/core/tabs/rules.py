"""Settlement by tabs and epoch batches: the state transition (pure; issue 37, DESIGN.md "Settlement").

**Money** (base units). A tab's ``locked`` credits stay the requester's, counted in its account's ``escrow``. An
:class:`~.tabtx.EpochBatch` moves, for each voucher, ``min(cumulative − redeemed, locked)`` out of the tab and the
requester's escrow into the batch's ``amount``, held in the worker's ``escrow`` (its *pending* credits): no worker
is paid beyond what the requester signed, no requester owes beyond its lock. When the batch is final its amount
moves to the worker's balance (``paid``: spendable), or back to the tabs it came from (``forfeited``,
``refuted``; to the requester's balance when the tab is closing or gone); committee fees come out of it. Every
move is between accounts, so balances + bonds + escrows (:meth:`node.ledger.core.state.State.supply`) is constant;
slashes move bond to the treasury's balance.

**Sampling after commitment** (Livepeer's claim-then-audit). At the end of the block after the batch's, whose hash
nobody knew when the batch was signed, ``m`` distinct leaf indices are drawn:
``H("tally/tab-draw/v1" ‖ beacon ‖ batch key ‖ j) mod count`` for j = 0, 1, ... until ``m`` are distinct, with
``m = max(2, batch_samples × p(worker) / sample_base_ppm)`` (``p`` the worker's adaptive rate,
:func:`node.ledger.core.sampling.sampling_ppm`: a record of valid verdicts halves it) and at most ``count``. The
worker reveals each drawn receipt with its inclusion proof (:class:`~.tabtx.Reveal`) within ``reveal_window``
blocks: it enters the receipts table as a pending receipt of kind :class:`TabReceiptKind` (always sampled), and
committees re-execute and vote on it exactly as on any receipt. A drawn receipt not revealed in time forfeits the
batch (refunded to its tabs) and slashes ``min(bond, slash_amount)``; a revealed receipt voted invalid refunds
the batch (the core slashes as for any invalid receipt). When every drawn receipt has a verdict and none is
invalid, the amount is spendable ``settle_window`` blocks later.

A batch is lost whole, so faking a fraction ``f`` of its receipts is caught with probability ``1 − (1 − f)^m``
(about ``m·f``) at the price of the whole batch, for a gain of ``f`` of it: any ``m ≥ 2`` makes it a loss in
expectation before the bond (``bench/verify.py --tabs`` prints it for the genesis' ``m``).

**Timers.** Each deadline is an entry of ``tab_due`` (height -> keys due then: ``b"s"`` + batch key, ``b"t"`` + tab
id), so a block looks only at what is due at its height, never at every tab or batch.
"""

from __future__ import annotations

from ....encoding import H
from ..genesis import TREASURY
from ..module import admit_receipt, credit
from ..rows import evolve
from ..sampling import sampling_ppm
from ..status import SETTLED, UNVERIFIED, VALID_S
from ..txbase import _check
from ..view import StateView
from .state import Settlement, SettlementStatus as St, Tab
from .tabtx import MAX_COUNT, EpochBatch, Reveal, TabClose, TabOpen, TabTopUp

DRAW_TAG = b"tally/tab-draw/v1"


def _enabled(s: StateView) -> None:
    _check(s.params.epoch_blocks > 0, "tabs are not enabled on this chain (genesis epoch_blocks is 0)")


def _due(s: StateView, height: int, key: bytes) -> None:
    """Schedule ``key`` (``b"s"`` + batch key or ``b"t"`` + tab id) for the end of block ``height``."""
    t = s.tables["tab_due"]
    k = height.to_bytes(8, "big")
    t[k] = (*t.get(k, ()), key)


def _move_escrow(s: StateView, account: bytes, d_balance: int, d_escrow: int) -> None:
    acc = s.account(account)
    s.accounts[account] = evolve(acc, balance=acc.balance + d_balance, escrow=acc.escrow + d_escrow)


# ------------------------------------------------------------------ tabs

def apply_open(s: StateView, tx: TabOpen) -> None:
    """Open tab ``tx.id``: ``amount`` moves from the requester's balance to its escrow.

    Raises:
        InvalidTx: tabs off, the worker is the requester, or the balance does not cover the amount.
    """
    _enabled(s)
    _check(tx.worker != tx.sender, "a tab's worker and requester must differ")
    _check(tx.id not in s.tables["tabs"], "tab already open")
    _check(s.account(tx.sender).balance >= tx.amount, "insufficient balance")
    _move_escrow(s, tx.sender, -tx.amount, tx.amount)
    s.tables["tabs"][tx.id] = Tab(requester=tx.sender, worker=tx.worker, locked=tx.amount)


def _own_tab(s: StateView, tab_id: bytes, sender: bytes) -> Tab:
    tab: Tab | None = s.tables["tabs"].get(tab_id)
    _check(tab is not None, "unknown tab")
    assert tab is not None
    _check(tab.requester == sender, "only the tab's requester may change it")
    _check(tab.close_at == 0, f"the tab is closing (its lock returns at the end of block {tab.close_at})")
    return tab


def apply_topup(s: StateView, tx: TabTopUp) -> None:
    """Add ``amount`` to an open tab's lock (balance to escrow).

    Raises:
        InvalidTx: unknown tab, another requester's, closing, or the balance does not cover it.
    """
    _enabled(s)
    tab = _own_tab(s, tx.tab_id, tx.sender)
    _check(s.account(tx.sender).balance >= tx.amount, "insufficient balance")
    _move_escrow(s, tx.sender, -tx.amount, tx.amount)
    s.tables["tabs"][tx.tab_id] = evolve(tab, locked=tab.locked + tx.amount)


def apply_close(s: StateView, tx: TabClose) -> None:
    """Close a tab: what is still locked at the end of block ``height + tab_close_delay`` returns to the requester;
    until then the worker may still redeem vouchers on it.

    Raises:
        InvalidTx: unknown tab, another requester's, or already closing.
    """
    _enabled(s)
    tab = _own_tab(s, tx.tab_id, tx.sender)
    at = s.height + 1 + s.params.tab_close_delay
    s.tables["tabs"][tx.tab_id] = evolve(tab, close_at=at)
    _due(s, at, b"t" + tx.tab_id)


# ------------------------------------------------------------------ batches

def epoch_of(height: int, epoch_blocks: int) -> int:
    """The epoch of block ``height``: ``height // epoch_blocks``."""
    return height // epoch_blocks


def apply_batch(s: StateView, b: EpochBatch) -> None:
    """Record ``b`` and move each voucher's amount from its tab to the batch (the worker's pending credits).

    Raises:
        InvalidTx: tabs off; an epoch other than this block's or the one before; a second batch of the worker for
            that epoch; no receipt, more than :data:`~.tabtx.MAX_COUNT`, or less work than receipts; an unbonded
            worker; a malformed voucher (:attr:`EpochBatch.voucher_receipts`), one for an unknown tab, a tab of
            another worker or requester, or one not newer than the tab's last redeemed voucher. ``s`` is unchanged.
    """
    _enabled(s)
    p, height = s.params, s.height + 1
    now = epoch_of(height, p.epoch_blocks)
    _check(b.epoch in (now, now - 1), f"a batch for epoch {b.epoch} is late or early (this block is in epoch {now})")
    _open, last = s.tables["worker_batches"].get(b.worker, (0, -1))
    _check(b.epoch > last, f"this worker already sent its batch for epoch {last}; a batch's epoch must be later")
    _check(1 <= b.count <= MAX_COUNT and b.work >= b.count, "a batch covers 1..2^32 receipts, each of work >= 1")
    _check(s.account(b.worker).bond >= p.min_bond, "worker is not bonded")
    tabs = s.tables["tabs"]
    payments: list[tuple[bytes, bytes, int, int, int]] = []
    changed: list[tuple[bytes, Tab]] = []
    for r in b.voucher_receipts:
        tab: Tab | None = tabs.get(r.tab_id)
        _check(tab is not None, f"voucher for unknown tab {r.tab_id.hex()[:16]}")
        assert tab is not None
        _check(tab.worker == b.worker and tab.requester == r.requester, "voucher for a tab of another worker or "
                                                                         "requester")
        _check(r.tab_nonce > tab.nonce, f"voucher nonce {r.tab_nonce} is not newer than the tab's {tab.nonce}")
        _check(r.cumulative >= tab.redeemed, "voucher owes less than the tab already redeemed")
        paid = min(r.cumulative - tab.redeemed, tab.locked)
        changed.append((r.tab_id, evolve(tab, locked=tab.locked - paid, redeemed=r.cumulative, nonce=r.tab_nonce)))
        payments.append((r.tab_id, tab.requester, paid, tab.nonce + 1, r.tab_nonce))
    for (tab_id, tab), (_, _, paid, _, _) in zip(changed, payments, strict=True):  # every check passed: now write
        tabs[tab_id] = tab
        _move_escrow(s, tab.requester, 0, -paid)
    amount = sum(paid for _, _, paid, _, _ in payments)
    _move_escrow(s, b.worker, 0, amount)  # pending: the worker's, not yet spendable
    s.tables["settlements"][b.key] = Settlement(worker=b.worker, epoch=b.epoch, root=b.root, count=b.count,
                                                work=b.work, amount=amount, payments=tuple(payments), height=height)
    s.tables["worker_batches"][b.worker] = (_open + 1, b.epoch)
    _due(s, height + 1, b"s" + b.key)  # drawn at the end of the next block, with its hash


def redeems(st: Settlement, tab_id: bytes, tab_nonce: int) -> bool:
    """Whether batch ``st``'s voucher on ``tab_id`` redeemed the receipt of tab nonce ``tab_nonce`` (its payment's
    first..last nonce covers it)."""
    return any(t == tab_id and lo <= tab_nonce <= hi for t, _r, _a, lo, hi in st.payments)


def draw_count(s: StateView, st: Settlement) -> int:
    """How many receipts of ``st`` are drawn (see the module docstring)."""
    p = s.params
    ppm = sampling_ppm(p.sample_base_ppm, p.sample_floor_ppm, s.account(st.worker).valid_run, p.adapt_step)
    return min(st.count, max(2, p.batch_samples * ppm // max(1, p.sample_base_ppm)))


def draw(beacon: bytes, key: bytes, count: int, m: int) -> tuple[int, ...]:
    """``m`` distinct leaf indices in ``[0, count)`` from ``beacon`` (``m <= count``), in draw order."""
    if m >= count:
        return tuple(range(count))
    out: dict[int, None] = {}
    j = 0
    while len(out) < m:
        out.setdefault(int.from_bytes(H(DRAW_TAG, beacon, key, j.to_bytes(8, "big")), "big") % count, None)
        j += 1
    return tuple(out)


def apply_reveal(s: StateView, rv: Reveal) -> None:
    """Admit a drawn receipt of a batch, proved against its root, as a pending receipt (sampled at once).

    Raises:
        InvalidTx: unknown or not revealing batch, another worker's, an index not drawn or already revealed, a
            proof that fails, the receipt of another worker, or a receipt already on the ledger.
    """
    st: Settlement | None = s.tables["settlements"].get(rv.batch_key)
    _check(st is not None, "unknown batch")
    assert st is not None
    _check(st.status == St.REVEALING, f"the batch is {st.status.value}, not waiting for reveals")
    _check(rv.worker == st.worker, "only the batch's worker reveals its receipts")
    _check(rv.index in st.draw, f"receipt {rv.index} of the batch was not drawn")
    j = st.draw.index(rv.index)
    _check(st.revealed[j] == b"", f"receipt {rv.index} is already revealed")
    r = rv.tab_receipt
    _check(r.worker == st.worker, "the revealed receipt is another worker's")
    _check(rv.proves(st.root, st.count), "the inclusion proof does not lead to the batch's root")
    decided = st.decided
    rec = s.receipts.get(r.id)
    hold = s.tables["tab_disputes"].get(r.id)
    if rec is not None and hold is not None and hold.batch_key == rv.batch_key:
        s.tables["tab_reveals"][r.id] = rv.batch_key  # its requester disputed it first: that verdict counts here
    elif rec is not None and hold is None and rec.status in (VALID_S, SETTLED, UNVERIFIED):
        decided += 1  # on the ledger and decided not invalid already (a dispute came first): not checked twice
    else:
        admit_receipt(s, r)
        s.tables["tab_reveals"][r.id] = rv.batch_key
    revealed = st.revealed[:j] + (r.id,) + st.revealed[j + 1:]
    st = evolve(st, revealed=revealed, decided=decided, status=St.CHECKING if all(revealed) else st.status)
    s.tables["settlements"][rv.batch_key] = after_verdict(s, rv.batch_key, st, s.height + 1)


def after_verdict(s: StateView, key: bytes, st: Settlement, height: int) -> Settlement:
    """``st`` moved to its settle window when every drawn receipt is revealed and decided (scheduled; the batch
    is paid at the end of its ``due`` block if no dispute is then open)."""
    if st.status == St.CHECKING and st.decided == len(st.draw):
        st = evolve(st, status=St.WINDOW, due=height + s.params.settle_window)
        _due(s, st.due, b"s" + key)
    elif st.status == St.WINDOW and not st.disputes and st.due <= height:  # the payment waited on a dispute
        _due(s, height + 1, b"s" + key)
    return st


def _refund(s: StateView, st: Settlement) -> None:
    """Return what ``st`` took from its tabs to them (to their requesters' balances when closing or gone)."""
    _move_escrow(s, st.worker, 0, -st.amount)
    # committee fees of verdicts before this end were paid out of the batch: the worker's bond makes them good, so
    # its requesters get back everything the batch took from them (as far as the bond goes)
    shortfall = sum(paid for _, _, paid, _, _ in st.payments) - st.amount
    acc = s.account(st.worker)
    take = min(acc.bond, max(0, shortfall))
    s.accounts[st.worker] = evolve(acc, bond=acc.bond - take, slashed=acc.slashed + take)
    left = st.amount + take
    tabs = s.tables["tabs"]
    for tab_id, requester, paid, _, _ in st.payments:
        back = min(paid, left)
        left -= back
        tab: Tab | None = tabs.get(tab_id)
        if tab is not None and tab.close_at == 0:
            tabs[tab_id] = evolve(tab, locked=tab.locked + back)
            _move_escrow(s, requester, 0, back)
        else:  # closing or closed: this part goes straight back to the requester's balance
            _move_escrow(s, requester, back, 0)


def _final(s: StateView, key: bytes, st: Settlement) -> None:
    """``st`` is final (paid, forfeited or refuted): its rows leave the state (pruned; its story is in the
    blocks' transactions and the receipts' records)."""
    s.tables["settlements"].pop(key, None)
    n, last = s.tables["worker_batches"].get(st.worker, (1, st.epoch))
    s.tables["worker_batches"][st.worker] = (n - 1, last)  # the last epoch stays: no second batch for it
    for rid in st.revealed:
        if rid:
            s.tables["tab_reveals"].pop(rid, None)


def end_block(s: StateView, height: int, block_hash: bytes) -> None:
    """Draw, forfeit, pay and close what is due at ``height`` (``block_hash``: the beacon)."""
    due = s.tables["tab_due"].pop(height.to_bytes(8, "big"), None)
    for key in due or ():
        if key[:1] == b"t":
            _close_tab(s, key[1:])
            continue
        bkey = key[1:]
        st: Settlement | None = s.tables["settlements"].get(bkey)
        if st is None:
            continue
        if st.status == St.DRAWING:
            picks = draw(block_hash, bkey, st.count, draw_count(s, st))
            at = height + s.params.reveal_window
            s.tables["settlements"][bkey] = evolve(st, status=St.REVEALING, draw=picks,
                                                   revealed=(b"",) * len(picks), due=at)
            _due(s, at, key)
        elif st.status == St.REVEALING and height >= st.due:
            _forfeit(s, bkey, st)
        elif st.status == St.WINDOW and height >= st.due and not st.disputes:  # (a dispute's verdict reschedules)
            _move_escrow(s, st.worker, st.amount, -st.amount)
            _final(s, bkey, st)


def _forfeit(s: StateView, key: bytes, st: Settlement) -> None:
    """A drawn receipt was not revealed in time: refund the batch, slash the worker's bond to the treasury."""
    _refund(s, st)
    acc = s.account(st.worker)
    slashed = min(acc.bond, s.params.slash_amount)
    s.accounts[st.worker] = evolve(acc, bond=acc.bond - slashed, slashed=acc.slashed + slashed, valid_run=0)
    credit(s, TREASURY, slashed)
    _final(s, key, st)


def _close_tab(s: StateView, tab_id: bytes) -> None:
    tab: Tab | None = s.tables["tabs"].pop(tab_id, None)
    if tab is not None:
        _move_escrow(s, tab.requester, tab.locked, -tab.locked)


def height_need(s: StateView) -> str | None:
    """``tab``: a batch's draw, reveal window or settlement window, or a closing tab's delay, ends at a height
    (an entry of ``tab_due``)."""
    return "tab" if len(s.tables["tab_due"]) else None


def unbond_blocker(s: StateView, account: bytes, bond_after: int) -> str | None:
    """A worker with a batch not final may not unbond (it could run from a forfeit)."""
    if s.tables["worker_batches"].get(account, (0, -1))[0]:
        return "an epoch batch of this worker is not final; unbond after it is paid"
    return None


__all__ = ["DRAW_TAG", "after_verdict", "apply_batch", "apply_close", "apply_open", "apply_reveal", "apply_topup",
           "draw", "draw_count", "end_block", "epoch_of", "redeems", "unbond_blocker"]
