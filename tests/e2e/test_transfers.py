"""Transfers through the wallet API: exact decimal amounts, refusals without state change, and 20 concurrent
transfers of a whole balance of which exactly one applies."""

from __future__ import annotations

import httpx
import pytest
import trio

from node.compute.model import make_tiny
from node.config import NodeConfig
from node.identity import Identity, dev_seed
from node.ledger.genesis import Genesis, Params
from node.runtime import Node

C = 10**9


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_amounts_and_concurrent_transfers(tmp_path, tiny):
    me, you = Identity.from_seed(dev_seed(0)), Identity.from_seed(dev_seed(5))
    g = Genesis("tally-test-transfers", 0, (me.account,), ((me.account, 10 * C, 0),), Params(block_time_ms=100))

    async def post(url, body, token):
        return await trio.to_thread.run_sync(lambda: httpx.post(url, json=body, timeout=30,
                                                                headers={"Authorization": f"Bearer {token}"}))

    async def main():
        nd = Node(NodeConfig(data_dir=tmp_path / "n0", genesis=g, model_dir=tiny, seed=dev_seed(0)))
        async with trio.open_nursery() as n:
            n.start_soon(nd.run)
            await nd.started.wait()
            url = f"{nd.api_url}/v1/transfer"
            refused = {}
            for amount in ("0", "-1", "NaN", "Infinity", "-inf", "1.0000000001", "1e400", "ten", "1,5"):
                r = await post(url, {"to": you.peer_id, "amount": amount}, nd.api_token)
                refused[amount] = (r.status_code, r.json()["code"])
            assert not nd.ledger.mempool
            replies = []

            async def one():
                replies.append(await post(url, {"to": you.peer_id, "amount": "10"}, nd.api_token))

            async with trio.open_nursery() as m:
                for _ in range(20):
                    m.start_soon(one)
            h = nd.ledger.state.height
            await nd.ledger.wait_for_height(h + 3, timeout=20)
            st = nd.ledger.state.detach()  # read after the node closed its store
            pending = list(nd.ledger.mempool)
            n.cancel_scope.cancel()
            return refused, replies, st, pending

    refused, replies, st, pending = trio.run(main)
    # refused by the schema's amount pattern (422) or by the decimal parser (400); either way nothing queued
    assert all(v in ((400, "bad_amount"), (422, "bad_request")) for v in refused.values()), refused
    # the API dry-runs each transfer against the ledger and the queued ones: exactly one is accepted, the other
    # 19 are refused, each with a code and a message saying why
    accepted = [r for r in replies if r.status_code == 200]
    others = [r for r in replies if r.status_code != 200]
    assert len(replies) == 20 and len(accepted) == 1, sorted(r.status_code for r in replies)
    assert accepted[0].json()["nonce"] == 0 and accepted[0].json()["kind"] == "transfer", accepted[0].json()
    assert all(r.status_code == 400 for r in others), [(r.status_code, r.text) for r in others]
    for r in others:
        body = r.json()
        assert body["code"] and body["message"], body
    # the ledger's outcome, whatever the mempool's admission rule: the balances moved by exactly one amount,
    # the sender's nonce advanced once, and nothing else is left queued to apply later
    assert st.account(you.account).balance == 10 * C
    assert st.account(me.account).balance == 0 and st.account(me.account).nonce == 1
    assert pending == [], pending
