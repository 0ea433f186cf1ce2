"""A server whose hop failed is left out of the next generations' routes for a while (its announcement or DHT record
may outlive it: found by the 30-node test, where every generation failed over from one stopped server), unless no
route exists without it (in-memory network, real span servers and torch, the tiny model)."""

from __future__ import annotations

import trio

from node.compute.reference import local_generate
from node.inference import client as client_mod

from .fakenet import make_swarm
from .test_session import PROMPT, SPANS, run


def test_a_dead_server_still_announced_is_left_out_of_the_next_routes(tiny, tmp_path):
    async def main():
        async with trio.open_nursery() as n:
            net, _servers, client = await make_swarm(n, tiny, tmp_path, [s for s in SPANS for _ in range(2)])
            killed = []

            async def on_token(i, tok, route):
                if i == 3 and not killed:
                    killed.append(route[1][0])
                    await net.kill(route[1][0])

            first = await client.generate(PROMPT, 8, on_token=on_token)
            still_announced = killed[0] in {p for p, _s, _e in client.swarm.live(client.manifest.model_id)}
            later = [await client.generate(PROMPT, 8) for _ in range(3)]
            n.cancel_scope.cancel()
            return killed[0], first, still_announced, later

    dead, first, still_announced, later = run(main)
    want = local_generate(tiny, PROMPT, 8)
    assert first.tokens == want and [f.dead for f in first.failovers] == [dead]
    assert still_announced  # the table still lists it: only the client's memory keeps it out
    for g in later:
        assert g.tokens == want and not g.failovers and dead not in [h[0] for h in g.route]


def test_a_suspect_is_used_when_no_route_exists_without_it_and_forgotten_after_a_while(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(client_mod, "SUSPECT_S", 0.5)

    async def main():
        async with trio.open_nursery() as n:
            _net, _servers, client = await make_swarm(n, tiny, tmp_path, SPANS)
            middle = client.route()[1][0]
            client._suspect(middle)  # as if its hop had failed once (a restart, or a fault on our side)
            alone = await client.generate(PROMPT, 6)
            held = set(client._live_suspects())
            await trio.sleep(0.6)
            n.cancel_scope.cancel()
            return middle, alone, held, client._live_suspects()

    middle, alone, held, after = run(main)
    assert alone.tokens == local_generate(tiny, PROMPT, 6) and middle in [h[0] for h in alone.route]
    assert held == {middle} and after == set()
