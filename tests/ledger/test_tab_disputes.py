"""Issue 37: "a requester may still dispute any receipt it holds within the window" -- a tab receipt's dispute on
the ledger (:mod:`node.ledger.core.tabs.checks`): its deposit, the batch's payment waiting for the verdict, an
invalid verdict refuting the batch, a valid one paying the committee from the deposit, the refusals, and a disputed
receipt that the draw picks afterwards. Real blocks and signatures in memory (:class:`tests.ledger.tabs_helpers.Chain`),
credits checked conserved at every block."""

from __future__ import annotations

from node.ledger.core.tabs import TabDispute
from node.ledger.core.tabs.checks import dispute_deposit
from node.ledger.core.tabs.state import SettlementStatus as St
from node.ledger.core.tx import INVALID, VALID

from .tabs_helpers import KEYS, C, Chain, tab_genesis

REQ, W1, OTHER = KEYS[0], KEYS[1], KEYS[5]


def _batch(c: Chain, amounts=(C, C, C, C, C)):
    tab = c.open_tab(REQ, W1, 10 * C)
    c.block()
    rs = c.receipts(W1, REQ, tab, list(amounts))
    b = c.batch(W1, rs)
    c.block()
    return tab, rs, b


def _dispute(c: Chain, b, r, sender=REQ) -> TabDispute:
    d = TabDispute(c.g.domain, sender.account, b.key, r.to_record()).signed(sender)
    c.send(d)
    return d


def _undrawn(c: Chain, b, rs):
    return next(r for i, r in enumerate(rs) if i not in c.settlement(b).draw)


def _reveal_all(c: Chain, b, rs) -> None:
    for i in c.settlement(b).draw:
        c.reveal(W1, b, rs, i)


def test_a_disputed_invalid_receipt_refutes_the_batch_and_returns_the_deposit():
    c = Chain(tab_genesis())
    tab, rs, b = _batch(c)
    c.block()  # drawn
    r = _undrawn(c, b, rs)  # a receipt the draw missed: only the requester's dispute puts it before a committee
    req0 = c.state.account(REQ.account)
    deposit = dispute_deposit(c.state, c.settlement(b))
    assert deposit > 0
    _dispute(c, b, r)
    c.block()
    assert not c.rejected, c.rejected
    assert c.settlement(b).disputes == 1 and c.state.receipts[r.id].status == "pending"
    assert c.state.account(REQ.account).escrow == req0.escrow + deposit
    c.block()  # sampled (always): its committee is drawn
    assert c.state.receipts[r.id].status == "sampled"
    bal0, bond0 = c.state.account(W1.account).balance, c.state.account(W1.account).bond
    c.vote_all(INVALID)
    c.block()
    assert c.state.receipts[r.id].status == "invalid"
    assert c.settlement(b) is None  # refuted: every credit of the batch back in the tab
    assert c.state.tables["tabs"][tab].locked == 10 * C and c.state.tables["tab_disputes"].get(r.id) is None
    w = c.state.account(W1.account)
    assert w.escrow == 0 and w.balance == bal0 and w.bond < bond0
    req = c.state.account(REQ.account)
    assert req.escrow == req0.escrow + 5 * C and req.balance == req0.balance  # the deposit came back


def test_a_disputed_valid_receipt_pays_the_committee_from_the_deposit_and_the_batch_waits_for_it():
    c = Chain(tab_genesis())
    _tab, rs, b = _batch(c)
    c.block()
    r = _undrawn(c, b, rs)
    _reveal_all(c, b, rs)
    _dispute(c, b, r)
    c.block()
    assert not c.rejected, c.rejected
    req0 = c.state.account(REQ.account)
    deposit = c.state.tables["tab_disputes"][r.id].deposit
    c.block()  # the three receipts get committees
    drawn = [rs[i].id for i in c.settlement(b).draw]
    c.vote_all(VALID)
    c.block()
    assert c.state.receipts[r.id].status == "valid" and all(c.state.receipts[i].status == "valid" for i in drawn)
    st = c.settlement(b)
    assert st.status == St.WINDOW and st.disputes == 0 and st.decided == 2
    req = c.state.account(REQ.account)
    members = c.state.receipts[r.id].committee
    assert req.escrow == req0.escrow - deposit  # the deposit is spent ...
    assert req.balance == req0.balance + deposit - deposit // len(members) * len(members)  # ... its rest returned
    c.block(2)
    assert c.settlement(b) is None and c.state.account(W1.account).escrow == 0  # paid


def test_the_batch_is_not_paid_while_a_dispute_is_open():
    c = Chain(tab_genesis(settle_window=1, verdict_timeout=6))
    _tab, rs, b = _batch(c)
    c.block()
    _reveal_all(c, b, rs)
    c.block(2)
    c.vote_all(VALID)
    c.block()
    assert c.settlement(b).status == St.WINDOW
    r = _undrawn(c, b, rs)
    _dispute(c, b, r)  # in the last block of the window
    c.block(3)  # past the window's end: the payment waits
    assert not c.rejected and c.settlement(b).status == St.WINDOW and c.settlement(b).disputes == 1
    assert c.state.account(W1.account).escrow > 0
    c.vote_all(VALID)
    c.block(2)
    assert c.settlement(b) is None and c.state.account(W1.account).escrow == 0


def test_a_disputed_receipt_that_the_draw_picks_is_revealed_against_the_disputes_verdict():
    c = Chain(tab_genesis())
    _tab, rs, b = _batch(c, amounts=(C, C))  # two receipts, two drawn: both
    _dispute(c, b, rs[0])  # before the draw
    c.block()
    assert not c.rejected, c.rejected
    assert c.settlement(b).status == St.REVEALING and 0 in c.settlement(b).draw
    _reveal_all(c, b, rs)  # receipt 0 is on the ledger already: the reveal links it, no second check
    c.block()
    assert not c.rejected, c.rejected
    c.block()
    c.vote_all(VALID)
    c.block()
    st = c.settlement(b)
    assert st.status == St.WINDOW and st.decided == 2 and st.disputes == 0
    c.block(2)
    assert c.settlement(b) is None


def test_bad_disputes_are_refused_and_change_nothing():
    c = Chain(tab_genesis())
    tab, rs, b = _batch(c)
    other_tab = c.open_tab(OTHER, W1, 5 * C)
    c.block()
    _reveal_all(c, b, rs)
    c.block()
    drawn = rs[c.settlement(b).draw[0]]
    undrawn = _undrawn(c, b, rs)
    later = c.receipts(W1, REQ, tab, [C], start_nonce=6, start_owed=5 * C)[0]  # not redeemed by this batch
    stranger = c.receipts(W1, OTHER, other_tab, [C])[0]
    cases = [(_dispute(c, b, undrawn, sender=OTHER), "only the receipt's requester"),
             (_dispute(c, b, later), "did not redeem the receipt"),
             (_dispute(c, b, stranger, sender=OTHER), "did not redeem the receipt"),
             (_dispute(c, b, drawn), "before a committee already")]
    c.block()
    assert len(c.rejected) == len(cases)
    for (tx, want), (rtx, why) in zip(cases, c.rejected, strict=True):
        assert rtx.id == tx.id and want in why, (want, why)
    assert c.settlement(b).disputes == 0 and not c.state.tables["tab_disputes"]
    _dispute(c, b, undrawn)
    _dispute(c, b, undrawn)
    c.block()
    assert len(c.rejected) == 1 and "already disputed" in c.rejected[0][1]
    c.block()
    c.vote_all(VALID)
    c.block(4)
    assert c.settlement(b) is None  # paid: its window closed
    _dispute(c, b, rs[-1])
    c.block()
    assert c.rejected and "unknown batch, or its window closed" in c.rejected[0][1]


def test_a_receipt_found_valid_on_dispute_and_drawn_later_counts_as_decided_when_revealed():
    c = Chain(tab_genesis(reveal_window=4))
    _tab, rs, b = _batch(c, amounts=(C, C))  # two receipts, both drawn
    _dispute(c, b, rs[0])
    c.block(2)  # drawn; the disputed receipt gets its committee
    c.vote_all(VALID)
    c.block()
    assert c.state.receipts[rs[0].id].status == "valid" and c.settlement(b).status == St.REVEALING
    _reveal_all(c, b, rs)
    c.block()
    assert not c.rejected, c.rejected
    assert c.settlement(b).decided == 1  # the disputed one, without a second committee
    assert c.state.receipts[rs[1].id].status == "pending"
    c.block()
    c.vote_all(VALID)
    c.block()
    assert c.settlement(b).status == St.WINDOW and c.settlement(b).decided == 2
