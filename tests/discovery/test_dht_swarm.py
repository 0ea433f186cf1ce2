"""Nodes started with ``discovery="dht"`` (issue 39): span servers publish signed records in Kademlia instead of
gossiping announcements and no node gossips its presence; the client looks its route up when it generates, the
generation is identical to one process, and committees find the workers whose receipts they re-execute (real
nodes, real libp2p on 127.0.0.1, real LevelDB, the tiny model)."""

from __future__ import annotations

import pytest
import trio

from node.compute.model import make_tiny
from node.compute.reference import local_generate
from node.discovery.service import Mode
from node.encoding import unpack
from node.ledger.core.state import VALID_S
from tests.e2e.swarm import swarm, wait_final

SPANS = [(0, 2), (2, 4), (4, 6), (0, 3), (3, 6)]
PROMPT = [5, 17, 42, 99, 3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_a_route_found_in_the_dht_generates_what_one_process_does_and_committees_verify_it(tmp_path, tiny):
    published: list[dict] = []

    async def main():
        async with swarm(tmp_path, tiny, SPANS, discovery="dht") as nodes:
            for nd in nodes[1:]:
                real = nd.host.publish

                async def spy(topic, data, _real=real):
                    if topic.endswith("/shards"):
                        published.append(unpack(data))
                    return await _real(topic, data)

                nd.host.publish = spy
            client = nodes[0]
            client.swarm.entries.clear()  # forget what the fixture looked up: the generation must ask
            client.dht_feed._last.clear()
            looked = client.dht_feed.lookups
            gen = await client.generate(PROMPT, 8)
            recs = await wait_final(client, [r.id for r in gen.receipts], timeout=60)
            await trio.sleep(1.5)  # more than a record period: servers republish meanwhile
            modes = [nd.discovery.mode for nd in nodes]
            held = [len(nd.discovery.store) for nd in nodes]
            tables = [nd.discovery.routing_table_size() for nd in nodes]
            return gen, looked, client.dht_feed.lookups, modes, held, tables, recs

    gen, looked_before, looked_after, modes, held, tables, recs = trio.run(main)
    assert gen.tokens == local_generate(tiny, PROMPT, 8)
    assert {h[1:] for h in gen.route} <= set(SPANS) and gen.route[0][1] == 0 and gen.route[-1][2] == 6
    assert modes == [Mode.SERVER] * (len(SPANS) + 1)  # a validator and servers hold records
    assert sum(held) >= len(SPANS) and all(t >= 1 for t in tables)
    assert looked_after > looked_before  # the generation asked the DHT
    assert published == []  # neither spans nor presence on gossip
    assert len(recs) == len(gen.route) and all(r.status == VALID_S and len(r.committee) == 2 for r in recs.values())
