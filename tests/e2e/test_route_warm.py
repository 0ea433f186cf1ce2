"""A client node keeps its route's servers connected before it generates (issue 25: the first token in seconds).

Real nodes on 127.0.0.1 (libp2p, LevelDB, the tiny Llama): a validator, two span servers bootstrapped to it, and
two client nodes bootstrapped to it alone. On loopback a node keeps no connections beyond its bootstrap peers
(``NetworkService._target``), so only :meth:`RouteClient.keep_route_connected` connects a client to the servers:
the client with it (the default for a node that serves no span) is connected to both before any generation, the
client without it (``warm_route=False``) to neither, and the first generation of the warmed client goes through
the connections that were already there.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio

from node.compute.model import make_tiny
from node.runtime import Node

from .swarm import node_config, tiny_genesis


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_a_client_connects_to_its_route_before_generating(tmp_path, tiny):
    g = tiny_genesis(4)

    async def main():
        async with trio.open_nursery() as n:
            v = Node(node_config(tmp_path, 0, g, tiny))
            n.start_soon(v.run)
            await v.started.wait()
            servers = [Node(replace(node_config(tmp_path, i, g, tiny, span=span), bootstrap=v.host.addrs))
                       for i, span in ((1, (0, 3)), (2, (3, 6)))]
            warm = Node(replace(node_config(tmp_path, 3, g, tiny), bootstrap=v.host.addrs))
            cold = Node(replace(node_config(tmp_path, 4, g, tiny), bootstrap=v.host.addrs, warm_route=False))
            for nd in (*servers, warm, cold):
                n.start_soon(nd.run)
            for nd in (*servers, warm, cold):
                await nd.started.wait()
            want = {s.ident.peer_id for s in servers}
            with trio.fail_after(30):  # both spans announced to both clients
                while not all(len(c.swarm.live(c.manifest.model_id)) == 2 for c in (warm, cold)):
                    await trio.sleep(0.1)
            with trio.fail_after(30):  # the warmed client dials its route without being asked to generate
                while not want <= set(warm.host.connected_peers()):
                    await trio.sleep(0.1)
            assert {p for p, _s, _e in warm.client.route()} == want
            # the same time again: the client without the warmer still has its bootstrap connection only
            await trio.sleep(3.0)
            assert not want & set(cold.host.connected_peers()), cold.host.connected_peers()
            gen = await warm.generate([3, 4, 5], 2)
            assert len(gen.tokens) == 2 and {p for p, _s, _e in gen.route} == want
            assert gen.first_token_s is not None and 0 < gen.first_token_s <= gen.seconds
            n.cancel_scope.cancel()

    trio.run(main)
