"""Routing by measured speed and free cache, block selection and announcement timing (pure)."""

from __future__ import annotations

import pytest
import trio

from node.compute.shards import NoRouteError, SpanInfo, block_coverage, choose_blocks, choose_route
from node.encoding import pack
from node.inference.server import check_announce_timing
from node.inference.swarm import SwarmTable


def S(peer, start, end, tput=1000.0, lat=0.01, free=None):
    return SpanInfo(peer, start, end, tput, lat, free)


def peers(route):
    return [s.peer for s in route]


def test_fastest_route_wins_and_ties_are_deterministic():
    spans = [S("a", 0, 3, lat=0.010), S("b", 0, 3, lat=0.004), S("c", 3, 6, lat=0.004), S("d", 3, 6, lat=0.004)]
    assert peers(choose_route(spans, 6)) == ["b", "c"]  # b is faster; c and d tie -> smaller peer id
    assert peers(choose_route(list(reversed(spans)), 6)) == ["b", "c"]
    assert peers(choose_route(spans, 6, exclude={"b", "c"})) == ["a", "d"]


def test_fewer_hops_beat_more_hops_of_equal_server_time():
    spans = [S("one", 0, 6, lat=0.010), S("x", 0, 3, lat=0.005), S("y", 3, 6, lat=0.005)]
    assert peers(choose_route(spans, 6)) == ["one"]  # the per-hop overhead breaks the tie
    slow = [S("one", 0, 6, lat=0.030), S("x", 0, 3, lat=0.005), S("y", 3, 6, lat=0.005)]
    assert peers(choose_route(slow, 6)) == ["x", "y"]


def test_measured_rtt_and_throughput_count():
    spans = [S("near", 0, 6, lat=0.010), S("far", 0, 6, lat=0.005)]
    assert peers(choose_route(spans, 6)) == ["far"]
    assert peers(choose_route(spans, 6, rtt={"far": 0.050})) == ["near"]  # 25 ms each way to "far"
    # a server whose throughput says it is slower than its (stale) latency is judged by the slower figure
    assert choose_route([S("t", 0, 6, tput=10.0, lat=0.001)], 6)[0].step_seconds() == pytest.approx(0.1)


def test_free_cache_filters_servers():
    spans = [S("full", 0, 6, lat=0.001, free=10), S("roomy", 0, 6, lat=0.009, free=1000), S("unknown", 0, 6)]
    assert peers(choose_route(spans, 6, need_cache=100)) == ["roomy"]
    assert peers(choose_route(spans, 6, need_cache=5)) == ["full"]
    with pytest.raises(NoRouteError):
        choose_route(spans[:1], 6, need_cache=100)


def test_sub_range_for_failover_and_errors():
    spans = [S("a", 0, 2), S("b", 2, 4), S("c", 4, 6), S("b2", 2, 3), S("b3", 3, 4)]
    assert peers(choose_route(spans, 6, 2, 4, exclude={"b"})) == ["b2", "b3"]
    with pytest.raises(NoRouteError) as ei:
        choose_route(spans, 6, 2, 4, exclude={"b", "b3"})
    assert ei.value.block == 3
    with pytest.raises(NoRouteError) as ei:
        choose_route([S("a", 0, 2), S("c", 3, 6)], 6)
    assert ei.value.block == 2
    with pytest.raises(ValueError):
        choose_route(spans, 6, 4, 2)
    # a span leaving the requested range is not usable, nor is one entered in the middle
    with pytest.raises(NoRouteError):
        choose_route([S("a", 0, 4), S("b", 1, 6)], 6)


def test_block_selection_covers_the_weakest_blocks():
    # Petals' rule: uncovered blocks first, then the least throughput; ties to the smallest start
    assert choose_blocks(2, 6, []) == (0, 2)
    tiles = []
    for i in range(3):  # servers joining one after another tile the model
        tiles.append(SpanInfo(f"p{i}", *choose_blocks(2, 6, tiles), throughput=10.0))
    assert [(s.start, s.end) for s in tiles] == [(0, 2), (2, 4), (4, 6)]
    spans = [S("a", 0, 6, tput=50.0), S("b", 0, 3, tput=20.0)]
    assert block_coverage(spans, 6) == [70.0] * 3 + [50.0] * 3
    assert choose_blocks(3, 6, spans) == (3, 6)
    assert choose_blocks(3, 6, spans + [S("c", 3, 6, tput=40.0)]) == (0, 3)
    assert choose_blocks(3, 6, spans, me="b") == (0, 3)  # my own announcement does not count
    with pytest.raises(ValueError):
        choose_blocks(7, 6, [])


def test_announcement_expiry_must_exceed_refresh():
    check_announce_timing(5.0, 15.0)
    for period, ttl in ((5.0, 5.0), (5.0, 4.0), (0.0, 1.0)):
        with pytest.raises(ValueError):
            check_announce_timing(period, ttl)


def test_swarm_table_reads_measurements_and_expires():
    now = [100.0]
    table = SwarmTable(clock=lambda: now[0])
    mid = b"m" * 32

    def ann(peer, seq, **kw):
        return pack({"peer": peer, "model_id": mid, "start": 0, "end": 6, "seq": seq, "ttl": 3.0, **kw})

    async def feed():
        await table.on_announcement(ann("p", 1, throughput=50.0, latency=0.02, free_cache=300), "p")
        await table.on_announcement(ann("q", 1, throughput=float("nan"), latency=-1, free_cache="x"), "q")
        await table.on_announcement(ann("r", 1), "not-r")  # not the announcer: ignored

    trio.run(feed)
    infos = {s.peer: s for s in table.infos(mid)}
    assert set(infos) == {"p", "q"}
    assert (infos["p"].throughput, infos["p"].latency, infos["p"].free_cache) == (50.0, 0.02, 300)
    assert (infos["q"].throughput, infos["q"].latency, infos["q"].free_cache) == (0.0, 0.0, None)
    now[0] += 3.0
    assert table.infos(mid) == [] and table.live(mid) == []
