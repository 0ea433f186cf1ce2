"""Span discovery over real libp2p hosts on 127.0.0.1 with py-libp2p's Kademlia routing (issue 39): servers
publish signed span records on the peers closest to each key; a light client finds exactly the spans its route
can use, hears nothing of other models, holds nothing itself; expired, forged and foreign records go nowhere."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from node.discovery.keys import span_key
from node.discovery.record import SpanRecord, sign_record
from node.discovery.service import DISCOVERY_PROTOCOL, Discovery, Mode, with_lookup
from node.identity import Identity
from node.p2p.framing import RemoteError
from tests.p2p.util import run, running_hosts

MODEL_A, MODEL_B = bytes([1]) * 32, bytes([2]) * 32
NOW = [1_800_000_000.0]


def clock() -> float:
    return NOW[0]


async def _mesh(hosts, discs, join: bool = True) -> None:
    """Connect every host to host 0 and put each into the other's routing table (both ways); then, if ``join``,
    every node looks itself up (Kademlia's join, which also connects it to the peers near it)."""
    for h in hosts[1:]:
        assert await h.connect(hosts[0].addrs) >= 1
    pairs = [(discs[0], h) for h, d in zip(hosts[1:], discs[1:], strict=True) if d.mode is Mode.SERVER]
    pairs += [(d, hosts[0]) for d in discs[1:]]
    with trio.fail_after(10):
        for d, h in pairs:
            while not await d.add_peer(h.peer_id):  # identify has not stored the peer's protocols yet
                await trio.sleep(0.05)
    if join:
        async with trio.open_nursery() as n:
            for d in discs:
                n.start_soon(d.join)


@asynccontextmanager
async def dht_nodes(n: int, clients: int = 0, join: bool = True, **kw):
    """``n`` hosts on 127.0.0.1, the last ``clients`` of them light clients, each with a running Discovery
    (``kw`` passed on), meshed through host 0 (:func:`_mesh`); yields ``(hosts, discs)``; stops them all."""
    async with running_hosts(n) as hosts:
        discs = [Discovery(h, Mode.SERVER if i < n - clients else Mode.CLIENT, clock=clock, **kw)
                 for i, h in enumerate(hosts)]
        async with trio.open_nursery() as nursery:
            for d in discs:
                await nursery.start(d.run)
            await _mesh(hosts, discs, join=join)
            yield hosts, discs
            nursery.cancel_scope.cancel()


def test_a_light_client_finds_the_spans_of_its_route_and_nothing_else():
    async def main():
        async with dht_nodes(10, clients=2, replication=3) as (hosts, discs):
            spans = {1: (MODEL_A, 0, 2), 2: (MODEL_A, 2, 4), 3: (MODEL_A, 4, 6), 4: (MODEL_A, 0, 3),
                     5: (MODEL_A, 3, 6), 6: (MODEL_B, 0, 6), 7: (MODEL_A, 1, 6)}
            held = {}
            for i, (m, a, b) in spans.items():
                rec = sign_record(hosts[i].identity, m, a, b, throughput=10.0 * i, seq=1,
                                  expires=int(NOW[0]) + 300, addrs=tuple(hosts[i].addrs[:2]))
                held[i] = await discs[i].publish(rec)
            client = discs[9]
            route = await client.find_route_records(MODEL_A, 0, 6)
            found_b = await client.find(MODEL_B, 0)
            NOW[0] += 301  # every record has expired
            after = await client.find_route_records(MODEL_A, 0, 6)
            NOW[0] -= 301
            return hosts, discs, held, route, found_b, after

    hosts, discs, held, route, found_b, after = run(main, timeout=60)
    by_peer = {r.account: (r.start, r.end) for r in route}
    want = {hosts[i].identity.account: span for i, (m, *span) in
            {1: (MODEL_A, 0, 2), 2: (MODEL_A, 2, 4), 3: (MODEL_A, 4, 6), 4: (MODEL_A, 0, 3),
             5: (MODEL_A, 3, 6)}.items()}
    assert by_peer == {k: tuple(v) for k, v in want.items()}  # [1, 6) is never reached: no lookup of block 1
    assert [r.account for r in found_b] == [hosts[6].identity.account]
    assert after == []
    assert all(2 <= h <= 3 + 1 for h in held.values()), held  # on the 3 closest, and its server
    # a record lives only where its key is close: no server holds every record, nor do clients hold any
    assert max(len(d.store) for d in discs[:8]) < 7 and sum(len(d.store) for d in discs) <= 7 * 4
    assert all(d.routing_table_size() <= 7 for d in discs[:8])  # the 7 other servers: no client joins a table
    client = discs[9]
    assert len(client.store) == 0 and client.counters.served_find == client.counters.served_store == 0
    assert client.counters.sent > 0


def test_forged_foreign_and_tampered_records_are_refused():
    async def main():
        async with dht_nodes(3) as (hosts, discs):
            mine = sign_record(hosts[1].identity, MODEL_A, 0, 6, seq=1, expires=int(NOW[0]) + 300)
            errors = []
            # host 2 tries to store host 1's record in its name, then a record with a byte changed
            for data in (mine.encode(), mine.encode()[:-1] + bytes([mine.encode()[-1] ^ 1])):
                try:
                    await hosts[2].request(hosts[0].peer_id, DISCOVERY_PROTOCOL, {"op": "store", "record": data},
                                           5.0)
                except RemoteError as e:
                    errors.append(e.code)
            # host 0 answers finds with a tampered record: the asker refuses it and penalizes host 0
            good = sign_record(hosts[0].identity, MODEL_A, 0, 6, seq=1, expires=int(NOW[0]) + 300)
            bad = SpanRecord(**{**good.__dict__, "end": 5})
            discs[0].store.by_key[span_key(MODEL_A, 0)] = {good.account: bad}
            penalties = []
            hosts[1].penalize = lambda peer, w, ban_s=None: penalties.append(peer) or False
            got = await discs[1].find(MODEL_A, 0)
            return hosts, errors, got, penalties, discs

    hosts, errors, got, penalties, discs = run(main, timeout=40)
    assert errors == ["not_yours", "bad_record"]
    assert got == [] and hosts[0].peer_id in penalties
    assert discs[1].counters.bad_records >= 1 and discs[0].counters.bad_records == 1


def test_a_peer_known_to_nobody_here_is_found_in_the_dht_and_dialled():
    """Without presence gossip, a node reaches a peer it never heard of (a worker whose receipt it re-executes)
    through a Kademlia lookup: host 2 knows host 1 only as a peer id; both know host 0."""
    async def main():
        async with dht_nodes(3, join=False) as (hosts, discs):
            assert hosts[1].peer_id not in hosts[2].connected_peers()
            learnt = []

            async def nothing_known(peer):
                return None

            async def dial(peer, addrs):
                return await hosts[2].connect(addrs) > 0

            hosts[2].dial_hint = with_lookup(nothing_known, discs[2].find_peer_addrs,
                                             lambda p, a: learnt.append((p, a)), dial)
            hosts[1].set_request_handler("/tally/test-echo/1", lambda msg, remote: _echo(msg))
            reply = await hosts[2].request(hosts[1].peer_id, "/tally/test-echo/1", {"x": 7}, 10.0)
            unknown = await discs[2].find_peer_addrs(Identity.generate().peer_id)
            return hosts, reply, learnt, unknown

    hosts, reply, learnt, unknown = run(main, timeout=40)
    assert reply["x"] == 7
    assert learnt and learnt[0][0] == hosts[1].peer_id and all(a.endswith("/p2p/" + hosts[1].peer_id)
                                                               for a in learnt[0][1])
    assert unknown == []


async def _echo(msg):
    return {"x": msg.get("x")}
