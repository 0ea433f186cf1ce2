"""The whole flow with real peers: generate through 3 spans, receipts, committee votes, settlement."""

from __future__ import annotations

import pytest
import trio

from node.compute.model import make_tiny
from node.compute.reference import local_generate
from node.ledger.core.state import INVALID_S, VALID_S

from .swarm import swarm, wait_final

SPANS = [(0, 2), (2, 4), (4, 6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_generation_receipts_verdicts_and_balances(tmp_path, tiny):
    prompt = [5, 17, 42, 99, 3]

    async def main():
        async with swarm(tmp_path, tiny, SPANS) as nodes:
            client = nodes[0]
            before = {nd.ident.account: client.ledger.state.account(nd.ident.account) for nd in nodes}
            supply = client.ledger.state.supply()
            gen = await client.generate(prompt, 12)
            assert len(gen.receipts) == 3
            recs = await wait_final(client, [r.id for r in gen.receipts])
            after = {a: client.ledger.state.account(a) for a in before}
            # peers whose receipts landed keep reserved connection slots on every node for a while (issue 23)
            with trio.fail_after(10):
                while not all(nd.host.admission.peer_reserved(other.host.peer_id)
                              for nd in nodes for other in nodes if other is not nd):
                    await trio.sleep(0.1)
            return gen, recs, before, after, supply, client.ledger.state.supply()

    gen, recs, before, after, supply0, supply1 = trio.run(main)
    assert gen.tokens == local_generate(tiny, prompt, 12)
    assert all(r.status == VALID_S for r in recs.values())
    paid = sum(r.receipt.price for r in recs.values())
    client = next(iter(before))
    assert before[client].balance - after[client].balance == paid
    earned = sum(after[a].balance - before[a].balance for a in before if a != client)
    assert earned == paid and supply0 == supply1
    for r in recs.values():
        assert r.receipt.tokens == len(prompt) + 12 - 1 and len(r.committee) == 2
        assert {v[2] for v in r.votes} == {0}


def test_corrupting_server_is_slashed_and_client_refunded(tmp_path, tiny):
    async def main():
        async with swarm(tmp_path, tiny, SPANS, faults={2: "corrupt"}) as nodes:
            client = nodes[0]
            bad = nodes[2].ident.account
            bond0 = client.ledger.state.account(bad).bond
            bal0 = client.ledger.state.account(client.ident.account).balance
            gen = await client.generate([1, 2, 3], 6)
            recs = await wait_final(client, [r.id for r in gen.receipts])
            st = client.ledger.state
            return recs, bad, bond0, st.account(bad).bond, bal0, st.account(client.ident.account).balance

    recs, bad, bond0, bond1, bal0, bal1 = trio.run(main)
    by_worker = {r.receipt.worker: r for r in recs.values()}
    assert by_worker[bad].status == INVALID_S
    assert bond0 - bond1 == by_worker[bad].slashed > 0
    honest = [r for w, r in by_worker.items() if w != bad]
    assert all(r.status == VALID_S for r in honest)
    assert bal0 - bal1 == sum(r.receipt.price for r in honest)  # refunded for the corrupt hop


def test_announcements_refresh_so_routes_outlive_the_ttl(tmp_path, tiny):
    """Each refresh must reach the client (gossip de-duplicates identical bytes): generation still works after
    several announcement lifetimes."""
    async def main():
        async with swarm(tmp_path, tiny, SPANS) as nodes:
            client = nodes[0]
            await trio.sleep(0.5 * 3 * 2.5)  # 2.5 TTLs of 3 periods of 0.5 s
            refreshes = [e["refreshes"] for e in client.swarm.entries.values()]
            gen = await client.generate([7, 8, 9], 3)
            return refreshes, gen

    refreshes, gen = trio.run(main)
    assert len(refreshes) == 3 and min(refreshes) >= 5
    assert len(gen.tokens) == 3
