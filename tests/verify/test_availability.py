"""Availability: committee members fetch a session's tensors from the worker or, failing that, the requester;
when nobody has them, members abstain, the committee escalates, and the receipt settles as unverified within
the genesis' bounded number of rounds without penalising the worker."""

from __future__ import annotations

import shutil

import pytest
import trio

from node.compute.model import make_tiny

from ..e2e.swarm import swarm, wait_final

SPANS = [(0, 2), (2, 4), (4, 6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def forget(node, receipt) -> None:
    """Delete a session's input and output blobs from ``node``'s store."""
    for root in (receipt.inputs_root, receipt.outputs_root):
        (node.blobs.dir / root.hex()).unlink(missing_ok=True)


def wipe(node) -> None:
    shutil.rmtree(node.blobs.dir)
    node.blobs.dir.mkdir()


def test_members_fall_back_to_the_requester_then_abstain(tmp_path, tiny):
    async def main():
        async with swarm(tmp_path, tiny, SPANS) as nodes:
            client, w1, w2 = nodes[0], nodes[1], nodes[2]
            # A: worker 1 lost its session; the requester still holds it
            gen = await client.generate([4, 5, 6], 4)
            first = {r.worker: r for r in gen.receipts}
            forget(w1, first[w1.ident.account])
            recs_a = await wait_final(client, [r.id for r in gen.receipts], timeout=60)
            # B: nobody holds worker 2's next session any more
            before = client.ledger.state.account(w2.ident.account)
            gen = await client.generate([7, 8, 9], 4)
            second = {r.worker: r for r in gen.receipts}
            wipe(w2)
            wipe(client)
            recs_b = await wait_final(client, [r.id for r in gen.receipts], timeout=60)
            after = client.ledger.state.account(w2.ident.account)
            return (first, recs_a, second, recs_b, w1.ident.account, w2.ident.account, before, after,
                    client.genesis.params)

    _first, recs_a, second, recs_b, _a1, a2, before, after, params = trio.run(main)
    assert all(r.status == "valid" for r in recs_a.values())  # worker 1's from the requester, checked by root
    r2 = recs_b[second[a2].id]
    assert r2.status == "unverified" and r2.round == params.max_rounds - 1
    assert r2.votes and all(v[2] == 2 for v in r2.votes)  # every vote an abstention
    assert r2.payouts == ((a2, r2.receipt.price),) and r2.slashed == 0  # paid in full, never penalised
    assert after.bond == before.bond and after.slashed == 0
    assert all(r.status == "valid" for rid, r in recs_b.items() if rid != r2.receipt.id)
