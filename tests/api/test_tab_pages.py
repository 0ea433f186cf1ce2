"""Issue 37: the explorer's epoch batch and tab pages render what the ledger holds (templates with StrictUndefined:
a field the view lacks fails here), from a real chain in memory mid-epoch: a batch drawn and half revealed."""

from __future__ import annotations

from node.api.pages import ENV
from node.api.tabsapi import settlement_json, tab_json
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
