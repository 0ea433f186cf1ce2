"""Settlement's HTTP router, ``GET /v1/accounts/{account}/tabs`` and ``GET /v1/settlements/{key}``: tabs and epoch
batches (issue 37), and their JSON views, which the explorer's tab and settlement pages show too.
:func:`node.api.app.create_app` includes the router; it builds on :mod:`node.web` (the node dependency,
``ApiError``, the JSON helpers).

An account's tabs are those it opened (as requester) or is paid through (as worker): locked (still the
requester's), redeemed (the newest voucher's cumulative the worker was paid from the tab), the tab nonce, and owed
(signed beyond what was redeemed: known to the tab's two ends only, so given when this node is one of them). Its
*pending* credits are what its epoch batches not yet final moved to it (its escrow, as a worker), and *spendable*
its balance. A batch (settlement) shows what it committed to, what it moved, the receipts drawn from it and their
reveals; once final (pruned from the state) the same from the explorer's index and the batch's block, with its fate.
The list of tabs is a scan of the tab table (``MAX_TABS`` at most): a node with millions of tabs answers with the
first ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ..ledger.core.tabs import EpochBatch
from ..ledger.core.tabs.state import Settlement, Tab
from ..web.deps import CapabilityNode, NodeDep
from ..web.errors import ApiError
from ..web.models import ErrorOut
from ..web.views import acct, amount, hexid, parse_account, parse_id
from .book import EpochBook
from .tabs import TabBook

if TYPE_CHECKING:
    from ..ledger.core.state import State
    from ..ledger.store import LedgerStore

MAX_TABS = 1000

router = APIRouter(prefix="/v1", tags=["tabs"])


def tab_json(tab_id: bytes, t: Tab) -> dict[str, Any]:
    return {"tab": tab_id.hex(), "requester": acct(t.requester), "worker": acct(t.worker),
            "locked": amount(t.locked), "redeemed": amount(t.redeemed), "nonce": t.nonce,
            "closes_at": t.close_at or None}


def tabs_of(s: State, a: bytes) -> tuple[list[dict[str, Any]], int]:
    """The tabs ``a`` opened or is paid through (the first :data:`MAX_TABS`), and the base units locked in those it
    opened, in one scan of the tab table."""
    tabs: list[dict[str, Any]] = []
    locked = 0
    for tab_id, t in s.tables["tabs"].items():
        if a in (t.requester, t.worker):
            if len(tabs) < MAX_TABS:
                tabs.append(tab_json(tab_id, t))
            if t.requester == a:
                locked += t.locked
    return tabs, locked


def settlement_json(key: bytes, st: Settlement) -> dict[str, Any]:
    return {"key": key.hex(), "worker": acct(st.worker), "epoch": st.epoch, "root": st.root.hex(),
            "count": st.count, "work": st.work, "pending": amount(st.amount), "status": st.status.value,
            "included_at": st.height, "due": st.due or None,
            "payments": [{"tab": t.hex(), "requester": acct(r), "amount": amount(a), "nonces": [lo, hi]}
                         for t, r, a, lo, hi in st.payments],
            "drawn": [{"index": i, "receipt": hexid(rid) if rid else None}
                      for i, rid in zip(st.draw, st.revealed, strict=False)],
            "decided": st.decided, "disputes": st.disputes, "final_at": None, "vouchers": []}


def final_settlement_json(store: LedgerStore, key: bytes) -> dict[str, Any] | None:
    """An epoch batch the state no longer holds, from the explorer's index and its block
    (:meth:`node.ledger.store.LedgerStore.batch_story`): what it committed to, its vouchers, the receipts revealed
    from it and its fate (``paid`` or ``refunded``; ``included`` while the index knows no end). None: no block
    included it (or its block's body is pruned)."""
    story = store.batch_story(key)
    if story is None:
        return None
    tx_id, fate, reveals = story
    loc = store.tx_location(tx_id)
    got = store.get_block(loc[0]) if loc is not None else None
    if got is None or loc is None:
        return None
    b = got[0].txs[loc[1]]
    if not isinstance(b, EpochBatch):
        return None
    return {"key": key.hex(), "worker": acct(b.worker), "epoch": b.epoch, "root": b.root.hex(), "count": b.count,
            "work": b.work, "pending": amount(0), "status": fate[0] if fate else "included",
            "included_at": loc[0], "final_at": fate[1] if fate else None, "due": None, "tx": tx_id.hex(),
            "payments": [], "vouchers": [{"tab": r.tab_id.hex(), "requester": acct(r.requester), "nonce": r.tab_nonce,
                                          "cumulative": amount(r.cumulative)} for r in b.voucher_receipts],
            "drawn": [{"index": i, "receipt": hexid(rid)} for i, rid in reveals], "decided": None, "disputes": 0}


def owed_on(node: CapabilityNode, tab_id: bytes, t: Tab) -> int | None:
    """What the requester has signed on ``tab_id`` beyond what the ledger redeemed (base units), as this node knows
    it: the highest cumulative it countersigned (its requester's tab book) or holds (its worker's epoch book); None
    for a tab this node is neither end of (only the two ends hold the receipts)."""
    me = node.ident.account
    tab_book, book = node.service(TabBook), node.service(EpochBook)
    if t.requester == me and tab_book is not None:
        signed = tab_book.signed.get(tab_id, 0)
    elif t.worker == me and book is not None:
        newest = book.newest(tab_id)
        signed = newest.cumulative if newest is not None else 0
    else:
        return None
    return max(0, signed - t.redeemed)


@router.get("/accounts/{account}/tabs", summary="Tabs an account opened or is paid through; pending and spendable",
            responses={400: {"model": ErrorOut}})
async def account_tabs(node: NodeDep, account: str) -> JSONResponse:
    a = parse_account(account)
    s = node.ledger.state
    tabs, locked = tabs_of(s, a)
    for x in tabs:  # "owed": signed and not yet redeemed, where this node holds the receipts
        tid = bytes.fromhex(x["tab"])
        owed = owed_on(node, tid, s.tables["tabs"][tid])
        x["owed"] = None if owed is None else amount(owed)
    acc = s.account(a)
    open_batches = s.tables["worker_batches"].get(a, (0, -1))[0]
    return JSONResponse({"account": acct(a), "tabs": tabs, "spendable": amount(acc.balance),
                         "pending": amount(acc.escrow) if open_batches else amount(0),
                         "locked_in_tabs": amount(locked),
                         "open_batches": open_batches, "height": s.height})


@router.get("/settlements/{key}", summary="An epoch batch: what it committed to, its draws, and its fate once final",
            responses={400: {"model": ErrorOut}, 404: {"model": ErrorOut}})
async def settlement(node: NodeDep, key: str) -> JSONResponse:
    k = parse_id(key, "batch key", 32)  # ApiError 400 bad_id, in the API's error shape
    st = node.ledger.state.tables["settlements"].get(k)
    if st is not None:
        return JSONResponse(settlement_json(k, st))
    final = final_settlement_json(node.store, k)
    if final is None:
        raise ApiError(404, "not_found", "no epoch batch under that key")
    return JSONResponse(final)


__all__ = ["MAX_TABS", "final_settlement_json", "owed_on", "router", "settlement_json", "tab_json", "tabs_of"]
