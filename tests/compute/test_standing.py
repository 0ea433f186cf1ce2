"""A server's standing from its ledger record (node/compute/standing.py) and routes weighed by it (pure)."""

from __future__ import annotations

import itertools
import math

import pytest

from node.compute.shards import NoRouteError, SpanInfo, choose_route
from node.compute.standing import NEW_FACTOR, PROVEN_RUN, PUNISHED_FACTOR, standing_factor, standings
from node.identity import Identity, dev_seed
from node.ledger.core.rows import Account


def peers(route):
    return [s.peer for s in route]


def test_factor_falls_with_each_valid_verdict_to_one_at_proven_run():
    for slashed in (0, 1, 10**12):
        factors = [standing_factor(Account(valid_run=n, slashed=slashed)) for n in range(PROVEN_RUN + 5)]
        assert all(a > b for a, b in itertools.pairwise(factors[:PROVEN_RUN + 1]))
        assert factors[PROVEN_RUN:] == [1.0] * 5  # proven: no factor whatever its past
        assert all(1.0 <= f <= PUNISHED_FACTOR and math.isfinite(f) for f in factors)


def test_punished_pays_more_than_new_which_pays_more_than_proven():
    new = standing_factor(Account())
    punished = standing_factor(Account(valid_run=0, slashed=5))
    proven = standing_factor(Account(valid_run=PROVEN_RUN, slashed=5))
    assert (punished, new, proven) == (PUNISHED_FACTOR, NEW_FACTOR, 1.0)
    assert punished > new > proven
    for n in range(PROVEN_RUN):  # at every run short of proven, a slashed past costs more
        assert standing_factor(Account(valid_run=n, slashed=1)) > standing_factor(Account(valid_run=n))


def test_standings_reads_each_peer_once_and_a_bad_peer_id_stands_as_new():
    a, b = (Identity.from_seed(dev_seed(i)) for i in (1, 2))
    book = {a.account: Account(valid_run=PROVEN_RUN), b.account: Account(slashed=7)}
    reads: list[bytes] = []

    def account(key: bytes) -> Account:
        reads.append(key)
        return book.get(key, Account())

    got = standings([a.peer_id, b.peer_id, a.peer_id, "not-a-peer"], account)
    assert got == {a.peer_id: 1.0, b.peer_id: PUNISHED_FACTOR, "not-a-peer": NEW_FACTOR}
    assert sorted(reads) == sorted([a.account, b.account])


def test_route_avoids_a_punished_server_while_another_covers_the_span():
    spans = [SpanInfo("bad", 0, 4, latency=0.01), SpanInfo("good", 0, 4, latency=0.01)]
    assert peers(choose_route(spans, 4)) == ["bad"]  # without standing: the tie goes to the smaller peer id
    standing = {"bad": PUNISHED_FACTOR, "good": 1.0}
    assert peers(choose_route(spans, 4, standing=standing)) == ["good"]
    assert peers(choose_route(spans, 4, standing={"bad": PUNISHED_FACTOR, "good": NEW_FACTOR})) == ["good"]
    # mid-route too: the punished server's half is routed around through two hops of others
    split = [SpanInfo("bad", 0, 4, latency=0.01), SpanInfo("x", 0, 2, latency=0.005),
             SpanInfo("y", 2, 4, latency=0.005)]
    assert peers(choose_route(split, 4)) == ["bad"]  # one hop saves the per-hop overhead
    assert peers(choose_route(split, 4, standing={"bad": PUNISHED_FACTOR})) == ["x", "y"]


def test_route_uses_a_punished_server_when_it_is_the_only_one():
    spans = [SpanInfo("good", 0, 2, latency=0.01), SpanInfo("bad", 2, 4, latency=0.01)]
    standing = {"bad": PUNISHED_FACTOR, "good": 1.0}
    assert peers(choose_route(spans, 4, standing=standing)) == ["good", "bad"]
    assert peers(choose_route(spans[1:], 4, start=2, standing=standing)) == ["bad"]
    with pytest.raises(NoRouteError):  # excluded is still excluded: a factor is not a ban, nor a pardon
        choose_route(spans, 4, exclude={"bad"}, standing=standing)


def test_faster_server_still_wins_among_equals_and_a_much_faster_new_one_beats_a_proven_one():
    spans = [SpanInfo("slow", 0, 4, latency=0.02), SpanInfo("fast", 0, 4, latency=0.01)]
    assert peers(choose_route(spans, 4, standing={"slow": 1.0, "fast": 1.0})) == ["fast"]
    assert peers(choose_route(spans, 4, standing={"slow": NEW_FACTOR, "fast": NEW_FACTOR})) == ["fast"]
    # a new server pays 1.5x: at half the time of a proven one it still gets the route ...
    assert peers(choose_route(spans, 4, standing={"slow": 1.0, "fast": NEW_FACTOR})) == ["fast"]
    # ... a punished one (3x) at half the time does not
    assert peers(choose_route(spans, 4, standing={"slow": 1.0, "fast": PUNISHED_FACTOR})) == ["slow"]


def test_route_with_standing_is_deterministic_and_bad_factors_are_refused():
    spans = [SpanInfo(p, 0, 4, latency=0.01) for p in ("c", "a", "b")]
    standing = {"a": 2.0, "b": 1.5, "c": 1.5}
    assert peers(choose_route(spans, 4, standing=standing)) == ["b"]  # b and c tie: smaller peer id
    assert peers(choose_route(list(reversed(spans)), 4, standing=standing)) == ["b"]
    for bad in (0.5, math.inf, math.nan, -1.0):
        with pytest.raises(ValueError):
            choose_route(spans, 4, standing={"a": bad})
