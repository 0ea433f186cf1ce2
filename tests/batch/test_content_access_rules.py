"""ContentAccess's rules on ledger records (real Batch, Item and BatchPost values; the state is a plain view of
the tables ContentAccess reads): item files for the requester, every drawn worker of any attempt and the audit
committee; results for the requester only; a settled batch must be named; sets refreshed at each height and kept
for a bounded number of batches. The same handler over real nodes: test_content_access.py."""

from __future__ import annotations

from types import SimpleNamespace

from node.batch import content as content_mod
from node.batch.content import ContentAccess
from node.identity import Identity
from node.ledger.core.batchstate import Batch, BatchStatus, Item, ItemStatus, item_key
from node.ledger.core.batchtx import BatchPost

IDS = [Identity.generate() for _ in range(7)]
REQ, W1, W2, W3, AUD, OUT, OTHER_REQ = IDS
R_OK, R_BAD = b"\x0a" * 32, b"\x0b" * 32


def post(sender: Identity, bid: bytes, root: bytes) -> BatchPost:
    return BatchPost("c", sender.account, bid, root, 2, "generate", 3, 2, 2, 10, 1, 5, 5, 0)


def state(height: int, batches: dict, items: dict, open_: list) -> SimpleNamespace:
    tables = {"batches": batches, "batch_items": items, "open_batches": open_}  # the batch module's tables
    return SimpleNamespace(height=height, tables=tables, ordered=tables.__getitem__)


class View:
    def __init__(self, st):
        self.state = st


def test_who_may_fetch_what():
    bid, root = b"\x01" * 16, b"\x11" * 32
    b = Batch(post(REQ, bid, root), height=1, status=BatchStatus.RUNNING, assigned=2)
    items = {
        item_key(bid, 0): Item(1, 2, 9, (W2.account, W3.account), 2, ItemStatus.ASSIGNED, tried=(W1.account,),
                               reveals=((W2.account, R_OK),)),
        item_key(bid, 1): Item(0, 2, 9, (W2.account, W3.account), 2, ItemStatus.ACCEPTED, result=R_OK,
                               reveals=((W2.account, R_OK), (W3.account, R_OK)), audit_committee=(AUD.account,),
                               audit_votes=((AUD.account, R_BAD),)),
    }
    view = View(state(5, {bid: b}, items, [bid]))
    acc = ContentAccess(view)
    for who in (REQ, W1, W2, W3, AUD):  # requester, an earlier attempt's worker, this attempt's, the auditor
        assert acc.allowed(root, who.peer_id), who
        assert acc.allowed(root, who.peer_id, bid), who
    assert not acc.allowed(root, OUT.peer_id) and not acc.allowed(root, OUT.peer_id, bid)
    assert acc.allowed(R_OK, REQ.peer_id) and acc.allowed(R_BAD, REQ.peer_id, bid)  # accepted, voted
    for who in (W1, W2, W3, AUD, OUT):  # results: the requester's alone
        assert not acc.allowed(R_OK, who.peer_id, bid), who
    assert not acc.allowed(b"\x0c" * 32, REQ.peer_id, bid)  # not a result of this batch
    assert not acc.allowed(root, REQ.peer_id, b"\x02" * 16)  # no such batch
    assert not acc.allowed(root, "not a peer id")

    # settled: out of the open batches; only a request that names it is checked against it
    settled = Batch(b.post, height=1, status=BatchStatus.SETTLED, assigned=2)
    view.state = state(6, {bid: settled}, items, [])
    assert not acc.allowed(root, W2.peer_id)
    assert acc.allowed(root, W2.peer_id, bid) and acc.allowed(R_OK, REQ.peer_id, bid)

    # a newly drawn worker is seen at the next height (the sets are rebuilt per height)
    items2 = dict(items)
    items2[item_key(bid, 0)] = Item(2, 7, 12, (OUT.account,), 1, tried=(W1.account, W2.account, W3.account))
    view.state = state(7, {bid: settled}, items2, [bid])
    assert acc.allowed(root, OUT.peer_id) and acc.allowed(root, W1.peer_id)

    # two open batches of the same item file: each one's workers may fetch it
    bid2 = b"\x03" * 16
    b2 = Batch(post(OTHER_REQ, bid2, root), height=3, status=BatchStatus.RUNNING, assigned=1)
    items2[item_key(bid2, 0)] = Item(0, 7, 12, (AUD.account,), 1)
    view.state = state(8, {bid: settled, bid2: b2}, items2, [bid, bid2])
    assert acc.allowed(root, AUD.peer_id) and acc.allowed(root, OTHER_REQ.peer_id) and acc.allowed(root,
                                                                                                   OUT.peer_id)


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(content_mod, "ACCESS_CACHE", 4)
    batches, items = {}, {}
    for k in range(10):
        bid = bytes([k]) * 16
        batches[bid] = Batch(post(REQ, bid, bytes([k]) * 32), height=1, assigned=1)
        items[item_key(bid, 0)] = Item(0, 1, 5, (W1.account,), 1)
    acc = ContentAccess(View(state(3, batches, items, [])))
    for bid in batches:
        assert acc.allowed(bid[:1] * 32, W1.peer_id, bid)
    assert len(acc._sets) <= 4
