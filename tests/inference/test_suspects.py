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


def test_a_dead_span_with_no_exact_replacement_is_replaced_with_its_neighbours(tiny, tmp_path):
    """Found by the 30-node test: servers 0:2, 2:4, 4:6 on the route and 0:3, 3:6 beside it; 2:4 dies. No server
    starts at block 2, so the whole route is replaced by 0:3 + 3:6, which replay hop 0's inputs (this round's
    included); the generation is identical and no position is paid twice."""
    async def main():
        async with trio.open_nursery() as n:
            net, servers, client = await make_swarm(n, tiny, tmp_path, [*SPANS, (0, 3), (3, 6)])
            for s in servers[3:]:
                client._suspect(s.ident.peer_id)  # the three-hop route first (fewer hops would win)
            killed = []

            async def on_token(i, tok, route):
                if i == 3 and not killed:
                    killed.append(route[1][0])
                    await net.kill(route[1][0])

            gen = await client.generate(PROMPT, 8, on_token=on_token)
            n.cancel_scope.cancel()
            return gen, killed[0], {s.ident.peer_id: (s.span.start, s.span.end) for s in servers}

    gen, dead, spans = run(main)
    assert gen.tokens == local_generate(tiny, PROMPT, 8)
    (fo,) = gen.failovers
    assert fo.dead == dead and spans[dead] == (2, 4) and fo.span == (0, 6)
    assert [spans[p] for p in fo.replacement] == [(0, 3), (3, 6)] and [h[1:] for h in gen.route] == [(0, 3), (3, 6)]
    total = len(PROMPT) + 8 - 1  # positions each block processes in an uninterrupted generation
    for b in range(6):
        paid = sum(r.tokens for r in gen.receipts if r.span_start <= b < r.span_end)
        assert paid <= total, (b, paid)  # never twice
        assert paid >= total - 1, (b, paid)  # at most the failing round unpaid
