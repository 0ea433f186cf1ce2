"""Issue 37: the explorer's epoch batch and tab pages render what the ledger holds (templates with StrictUndefined:
a field the view lacks fails here), from a real chain in memory mid-epoch: a batch drawn and half revealed."""

from __future__ import annotations

from node.api.pages import ENV
from node.settle.api import settlement_json, tab_json
from tests.ledger.tabs_helpers import KEYS, C, Chain, tab_genesis

REQ, W1 = KEYS[0], KEYS[1]


def test_batch_and_tab_pages_show_the_draw_the_reveals_and_the_payments():
    c = Chain(tab_genesis())
    tab = c.open_tab(REQ, W1, 10 * C)
    c.block()
    rs = c.receipts(W1, REQ, tab, [C, C, C, C])
    b = c.batch(W1, rs)
    c.block(2)
    st = c.settlement(b)
    c.reveal(W1, b, rs, st.draw[0])
    c.block()
    st = c.settlement(b)
    s = settlement_json(b.key, st)
    html = ENV.get_template("settlement.html").render(chain_id="c", head=c.state.height, now_ms=0, s=s)
    assert b.key.hex() in html and "revealing" in html and "not revealed yet" in html
    assert f'href="/receipts/{rs[st.draw[0]].id.hex()}"' in html and f'href="/tabs/{tab.hex()}"' in html
    t = tab_json(tab, c.state.tables["tabs"][tab])
    html = ENV.get_template("tab.html").render(chain_id="c", head=c.state.height, now_ms=0, t=t, batches=[s])
    assert f'href="/settlements/{b.key.hex()}"' in html and "4" in html and tab.hex() in html


def test_a_final_batch_keeps_its_page_from_the_index_paid_or_refunded(tmp_path):
    """Once final the state prunes a batch; its page and ``GET /v1/settlements/KEY`` then come from the explorer's
    index (a real LevelDB store) and the batch's block: what it committed to, its vouchers, the receipts revealed
    from it, and its fate -- paid after its window, refunded when a drawn receipt was withheld."""
    from node.ledger.core.tx import VALID
    from node.ledger.store import LedgerStore
    from node.settle.api import final_settlement_json

    g = tab_genesis()
    store = LedgerStore(tmp_path / "db", g)
    try:
        c = Chain(g, store)
        tab = c.open_tab(REQ, W1, 20 * C)
        c.block()
        rs = c.receipts(W1, REQ, tab, [C, C, C])
        b = c.batch(W1, rs)
        c.block(2)
        assert final_settlement_json(store, b.key)["status"] == "included"  # in the state still: not final
        drawn = c.settlement(b).draw
        for i in drawn:
            c.reveal(W1, b, rs, i)
        c.block(2)
        c.vote_all(VALID)
        c.block(4)
        assert c.settlement(b) is None  # paid and pruned
        s = final_settlement_json(store, b.key)
        assert s["status"] == "paid" and s["count"] == 3 and s["final_at"] > s["included_at"]
        assert sorted((d["index"], d["receipt"]) for d in s["drawn"]) == sorted((i, rs[i].id.hex()) for i in drawn)
        assert [(v["tab"], v["nonce"]) for v in s["vouchers"]] == [(tab.hex(), 3)]
        html = ENV.get_template("settlement.html").render(chain_id="c", head=c.state.height, now_ms=0, s=s)
        assert 'id="fate">paid' in html and f'href="/receipts/{rs[drawn[0]].id.hex()}"' in html
        c.block(4 - c.state.height % 4)  # the next epoch: a batch whose worker withholds a drawn receipt
        more = c.receipts(W1, REQ, tab, [C, C, C], start_nonce=4, start_owed=3 * C)
        b2 = c.batch(W1, more)
        c.block(2)
        c.reveal(W1, b2, more, c.settlement(b2).draw[0])
        c.block(4)
        assert c.settlement(b2) is None
        s2 = final_settlement_json(store, b2.key)
        assert s2["status"] == "refunded" and len(s2["drawn"]) == 1
        assert final_settlement_json(store, b"\x01" * 32) is None
    finally:
        store.close()


def test_owed_is_what_a_tab_end_signed_or_holds_beyond_what_was_redeemed(tmp_path):
    """``owed`` in ``GET /v1/accounts/A/tabs``: the requester's node knows the highest cumulative it signed, the
    worker's node the newest receipt in its epoch book; a node that is neither end of the tab does not know."""
    from types import SimpleNamespace

    from node.settle.api import owed_on
    from node.settle.book import EpochBook
    from node.settle.tabs import TabBook

    c = Chain(tab_genesis())
    tab = c.open_tab(REQ, W1, 10 * C)
    c.block()
    rs = c.receipts(W1, REQ, tab, [C, 2 * C])
    t = c.state.tables["tabs"][tab]
    # a node's running parts by type (node.runtime.Node.service): the requester's tab book, the worker's epoch book
    requester = SimpleNamespace(ident=REQ, service={TabBook: SimpleNamespace(signed={tab: rs[-1].cumulative})}.get)
    book = EpochBook(tmp_path / "book", c.g.domain)
    try:
        for r in rs:
            book.add(r)
        worker = SimpleNamespace(ident=W1, service={EpochBook: book}.get)
        other = SimpleNamespace(ident=KEYS[3], service={}.get)
        assert owed_on(requester, tab, t) == owed_on(worker, tab, t) == 3 * C and owed_on(other, tab, t) is None
        c.batch(W1, rs)
        c.block()  # the batch redeemed both: nothing owed any more
        t = c.state.tables["tabs"][tab]
        assert owed_on(requester, tab, t) == owed_on(worker, tab, t) == 0
    finally:
        book.close()
