"""Issue 37: tabs and epoch batches on the ledger -- one transaction per worker and epoch covers its receipts,
paid from tabs through cumulative vouchers, audited by receipts drawn after the batch was included.

Each flow runs real blocks (propose, commit) on a state in memory, with real signatures; every block checks that
balances + bonds + escrows stay constant (:class:`tests.ledger.tabs_helpers.Chain`)."""

from __future__ import annotations

import pytest

from node.ledger.core.genesis import TREASURY
from node.ledger.core.state import genesis_state
from node.ledger.core.tabs.state import SettlementStatus
from node.ledger.core.tx import INVALID, VALID, Unbond
from node.ledger.genesis import GenesisError

from .tabs_helpers import KEYS, C, Chain, tab_genesis

REQ, W1, W2 = KEYS[0], KEYS[1], KEYS[5]


def _to_revealing(c: Chain, worker=W1, amounts=(C, C, C, C, C)):
    tab = c.open_tab(REQ, worker, 10 * C)
    c.block()
    rs = c.receipts(worker, REQ, tab, list(amounts))
    b = c.batch(worker, rs)
    c.block()  # included: the draw waits for the next block's hash
    assert c.settlement(b).status == SettlementStatus.DRAWING
    assert c.state.account(worker.account).escrow == sum(amounts)  # pending, not spendable
    c.block()
    st = c.settlement(b)
    assert st.status == SettlementStatus.REVEALING and len(st.draw) == 2 and len(set(st.draw)) == 2
    return tab, rs, b


def test_a_batch_pays_its_vouchers_after_its_drawn_receipts_are_voted_valid_and_the_window_closes():
    c = Chain(tab_genesis())
    tab, rs, b = _to_revealing(c)
    bal0 = c.state.account(W1.account).balance
    for i in c.settlement(b).draw:
        c.reveal(W1, b, rs, i)
    c.block()
    assert c.settlement(b).status == SettlementStatus.CHECKING
    assert {c.state.receipts[rs[i].id].status for i in c.settlement(b).draw} == {"pending"}
    c.block()  # the revealed receipts are sampled (always) and get committees
    assert c.vote_all(VALID) == 4
    c.block()
    st = c.settlement(b)
    assert st.status == SettlementStatus.WINDOW and st.decided == 2
    c.block(2)  # settle_window
    assert c.settlement(b) is None  # paid and pruned
    w = c.state.account(W1.account)
    fees = 5 * C - (w.balance - bal0)
    assert w.escrow == 0 and 0 < fees <= 2 * 5 * C // 2 * 1000 // 10_000 + 1  # committee_fee_bps of each draw
    assert c.state.tables["tabs"][tab].locked == 5 * C and c.state.tables["tabs"][tab].redeemed == 5 * C
    # one ledger transaction (and two reveals) covered five receipts; none of the three unrevealed is on it
    assert sum(1 for r in rs if r.id in c.state.receipts) == 2


def test_a_withheld_reveal_forfeits_the_batch_to_its_tab_and_slashes_the_bond():
    c = Chain(tab_genesis())
    tab, rs, b = _to_revealing(c)
    req_escrow = c.state.account(REQ.account).escrow
    bond = c.state.account(W1.account).bond
    c.reveal(W1, b, rs, c.settlement(b).draw[0])  # one of two
    c.block(3)  # reveal_window passes
    assert c.settlement(b) is None
    w = c.state.account(W1.account)
    assert w.escrow == 0 and w.bond == bond - min(bond, c.g.params.slash_amount)
    assert c.state.account(REQ.account).escrow == req_escrow + 5 * C  # back in the tab's lock
    assert c.state.tables["tabs"][tab].locked == 10 * C


def test_one_invalid_sampled_receipt_refunds_the_whole_batch():
    c = Chain(tab_genesis())
    tab, rs, b = _to_revealing(c)
    bal0 = c.state.account(W1.account).balance
    for i in c.settlement(b).draw:
        c.reveal(W1, b, rs, i)
    c.block(2)
    c.vote_all(INVALID)
    c.block()
    assert c.settlement(b) is None
    assert c.state.tables["tabs"][tab].locked == 10 * C  # every credit of the batch returned to the tab
    w = c.state.account(W1.account)
    assert w.escrow == 0 and w.balance == bal0 and w.slashed > 0
    assert c.state.account(TREASURY).balance > 0


def test_vouchers_never_pay_beyond_the_lock_or_twice():
    c = Chain(tab_genesis())
    tab = c.open_tab(REQ, W1, 3 * C)
    c.block()
    rs = c.receipts(W1, REQ, tab, [2 * C, 2 * C])  # the requester signed 4 C on a 3 C lock
    b = c.batch(W1, rs)
    c.block()
    assert c.settlement(b).amount == 3 * C and c.state.tables["tabs"][tab].locked == 0
    # the same voucher again (next epoch): not newer, refused, nothing moves
    c.block(4)
    c.batch(W1, rs)
    c.block()
    assert c.rejected and "not newer" in c.rejected[0][1]


def test_bad_batches_and_reveals_are_refused_and_change_nothing():
    c = Chain(tab_genesis())
    tab, rs, b = _to_revealing(c)
    other = c.open_tab(REQ, W2, C)
    c.block()
    root_before = c.state.state_root()
    drawn = c.settlement(b).draw
    undrawn = next(i for i in range(5) if i not in drawn)
    c.reveal(W1, b, rs, undrawn)  # not drawn
    c.reveal(W1, b, rs, drawn[0], proof=[b"x" * 32] * 3)  # a proof that leads elsewhere
    c.reveal(W1, b, rs, drawn[1], receipt=c.receipts(W1, REQ, tab, [C])[0])  # another receipt than the leaf
    c.batch(W1, rs, epoch=c.settlement(b).epoch)  # a second batch for that epoch
    c.batch(W1, c.receipts(W1, REQ, other, [C]))  # a voucher on a tab of another worker
    c.batch(W1, rs, epoch=99)  # an epoch far ahead
    c.send(rs[0])  # a bare tab receipt
    c.send(Unbond(c.g.domain, W1.account, C, c.nonce(W1)).signed(W1))  # a worker with an open batch
    c.block()
    reasons = [why for _, why in c.rejected]
    assert len(reasons) == 8, reasons
    for want in ("was not drawn", "inclusion proof", "inclusion proof", "already sent its batch",
                 "another worker", "late or early", "not alone", "epoch batch of this worker"):
        assert any(want in r for r in reasons), (want, reasons)
    assert c.state.tables["settlements"][b.key] == c.settlement(b)
    del root_before


def test_a_closed_tab_returns_its_lock_after_the_delay_and_a_worker_can_redeem_until_then():
    c = Chain(tab_genesis())
    tab = c.open_tab(REQ, W1, 4 * C)
    c.block()
    c.close(REQ, tab)
    c.block()
    c.topup(REQ, tab, C)  # refused: closing
    rs = c.receipts(W1, REQ, tab, [C])
    b = c.batch(W1, rs)
    c.block()
    assert "closing" in c.rejected[0][1]
    assert c.settlement(b).amount == C
    escrow = c.state.account(REQ.account).escrow
    c.block(12)
    assert tab not in c.state.tables["tabs"]
    assert c.state.account(REQ.account).escrow == escrow - 3 * C


def test_tabs_are_off_unless_genesis_sets_an_epoch_and_unsafe_settings_are_refused():
    g = tab_genesis(epoch_blocks=0)
    c = Chain(g)
    c.open_tab(REQ, W1, C)
    c.block()
    assert "not enabled" in c.rejected[0][1]
    with pytest.raises(GenesisError, match="batch_samples"):
        tab_genesis(batch_samples=1)
    with pytest.raises(GenesisError, match="tab_close_delay"):
        tab_genesis(tab_close_delay=5)
    assert "epoch_blocks" not in genesis_state(g).params.consensus_fields()  # 0: out of the genesis hash
