"""Ledger sync and submit replies under a budget and write deadlines (issue 23, finding 5): a sync reply is bounded
in bytes, reserves its memory from the node's ReplyBudget (``busy`` when full, all of it back afterwards), and a
follower syncs through it. Real LevelDB ledger, real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

import pytest
import trio

from node.encoding import pack
from node.ledger import service as svc_mod
from node.ledger.service import SUBMIT_PROTOCOL, SYNC_PROTOCOL, LedgerService
from node.ledger.store import LedgerStore
from node.p2p.budget import ReplyBudget
from node.p2p.framing import RemoteError
from tests.ledger.helpers import VALIDATOR, make_genesis
from tests.ledger.test_pruning import _grow

from .util import run, running_hosts


def test_sync_reply_bounded_budgeted_and_followed(tmp_path, monkeypatch):
    g = make_genesis()
    src = LedgerStore(tmp_path / "src", g)
    _grow(src, src.replay(), g, 10)
    sizes = [len(pack(src.get_block_raw(h))) for h in range(1, 11)]
    monkeypatch.setattr(svc_mod, "SYNC_REPLY_BYTES", sum(sizes[:3]))  # three blocks' worth per reply
    svc = LedgerService(src, g, VALIDATOR, None)
    dst_store = LedgerStore(tmp_path / "dst", g)

    async def main():
        async with running_hosts(2) as (h_src, h_dst):
            h_src.set_handler(SYNC_PROTOCOL, svc._sync_handler)
            h_src.set_handler(SUBMIT_PROTOCOL, svc._submit_handler)
            assert await h_dst.connect(h_src.addrs) == 1
            reply = await h_dst.request(h_src.peer_id, SYNC_PROTOCOL, {"from": 1}, timeout=10)
            assert [b["b"]["h"][1] for b in reply["blocks"]] == [1, 2, 3] and reply["head"] == 10
            assert svc.reply_budget.whole() and svc.reply_budget.granted == 3  # one reservation per block

            svc.reply_budget = ReplyBudget(per_peer=1, node_wide=1, wait=0.2)
            r = svc.reply_budget.try_reserve("someone", 1)
            with pytest.raises(RemoteError) as e:
                await h_dst.request(h_src.peer_id, SYNC_PROTOCOL, {"from": 1}, timeout=10)
            assert e.value.code == "busy"
            svc.reply_budget.release(r)

            # room for exactly one block: the reply stops there instead of waiting or overrunning the budget
            svc.reply_budget = ReplyBudget(per_peer=3 * max(sizes), node_wide=3 * max(sizes), wait=0.2)
            reply = await h_dst.request(h_src.peer_id, SYNC_PROTOCOL, {"from": 4}, timeout=10)
            assert [b["b"]["h"][1] for b in reply["blocks"]] == [4]
            assert svc.reply_budget.whole()

            with pytest.raises(RemoteError) as e:
                await h_dst.request(h_src.peer_id, SYNC_PROTOCOL, {"from": True}, timeout=10)
            assert e.value.code == "bad_request"
            with pytest.raises(RemoteError) as e:
                await h_dst.request(h_src.peer_id, SUBMIT_PROTOCOL, {"tx": {"x": 1}}, timeout=10)
            assert e.value.code == "invalid_tx"

            svc.reply_budget = ReplyBudget()
            follower = LedgerService(dst_store, g, VALIDATOR, h_dst)
            with trio.fail_after(30):
                applied = await follower.sync_from(h_src.peer_id)  # 4 replies of at most 3 blocks
            assert applied == 10 and follower.state.height == 10
            assert follower.state.state_root() == svc.state.state_root()
            return svc.reply_budget.granted

    assert run(main, timeout=60) == 10  # every block sent was reserved, and given back
    src.close()
    dst_store.close()
