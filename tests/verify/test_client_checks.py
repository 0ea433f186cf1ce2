"""Client checks on every hop: a server that returns NaN is rejected, banned for the session and routed
around; the client countersigns nothing for the bad response; the tokens still equal a local run."""

from __future__ import annotations

import pytest
import trio

from node.compute.model import make_tiny
from node.compute.reference import local_generate

from ..e2e.swarm import swarm, wait_final


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_nan_hop_is_rejected_banned_and_routed_around(tmp_path, tiny):
    spans = [(0, 2), (2, 4), (4, 6), (2, 4)]  # node 4 is an honest second server for blocks [2, 4)
    prompt = [11, 22, 33]

    async def main():
        async with swarm(tmp_path, tiny, spans, faults={2: "nan"}) as nodes:
            client, bad, spare = nodes[0], nodes[2], nodes[4]
            real = spare.server.announcement
            # looks slow: not chosen first
            spare.server.announcement = lambda *a, **k: {**real(*a, **k), "latency": 5.0}
            await trio.sleep(1.5)  # the slow-looking announcement reaches the client
            gen = await client.generate(prompt, 12)
            recs = await wait_final(client, [r.id for r in gen.receipts])
            return gen, recs, bad.ident.peer_id, bad.ident.account, spare.ident.peer_id

    gen, recs, bad_peer, bad_acct, spare_peer = trio.run(main)
    assert gen.tokens == local_generate(tiny, prompt, 12)
    assert [f.dead for f in gen.failovers] == [bad_peer] and gen.failovers[0].replacement == [spare_peer]
    bad_receipts = [r for r in recs.values() if r.receipt.worker == bad_acct]
    # positions 0..6 came back finite and were countersigned; position 7 (NaN) and after were not
    assert all(r.receipt.tokens <= 7 for r in bad_receipts)
    assert all(r.status == "valid" for r in recs.values())  # nothing countersigned was bad
