"""Committees drawn from thousands of bonded accounts (issue 37): beyond ``RANK_ALL`` eligible accounts members are
drawn by hashed index in O(k) hashes instead of ranking every account; at or below it the rule is the one every
chain so far used. Either way: distinct members, never the excluded, the committee's size, fixed by the beacon."""

from __future__ import annotations

import os
from collections import Counter

from node.encoding import H
from node.ledger.core import committee as cm


def _accounts(n: int) -> list[bytes]:
    return [H(b"acct", i.to_bytes(4, "big")) for i in range(n)]


def test_a_large_pool_draws_distinct_members_never_the_excluded_and_the_same_for_the_same_beacon():
    pool = _accounts(5000)
    ex = set(pool[:3])
    for round_ in (0, 1, 2):
        beacon, rid = os.urandom(32), os.urandom(32)
        a = cm.select_committee(beacon, rid, round_, pool, ex, 2)
        assert len(a) == len(set(a)) == 2 << round_ and not set(a) & ex
        assert a == cm.select_committee(beacon, rid, round_, tuple(sorted(pool)), ex, 2)  # list or sorted tuple
        assert a != cm.select_committee(os.urandom(32), rid, round_, pool, ex, 2)


def test_the_draw_is_uniform_over_the_pool():
    pool = tuple(sorted(_accounts(300)))
    counts = Counter(m for _ in range(6000) for m in cm.select_committee(os.urandom(32), b"r" * 32, 0, pool, (), 2))
    # 12,000 picks over 300 accounts: 40 each expected; a skewed draw (e.g. by byte order) would leave some at 0
    assert len(counts) == 300 and min(counts.values()) > 10 and max(counts.values()) < 80


def test_a_small_pool_keeps_the_ranking_rule():
    pool = _accounts(cm.RANK_ALL)
    beacon, rid = os.urandom(32), os.urandom(32)
    ranked = sorted(pool, key=lambda m: H(b"tally/committee/v1", beacon, rid, (0).to_bytes(4, "big"), m))
    assert cm.select_committee(beacon, rid, 0, pool, (), 2) == tuple(ranked[:2])


def test_a_pool_smaller_than_the_committee_gives_what_it_has():
    pool = tuple(sorted(_accounts(cm.RANK_ALL + 2)))
    got = cm.select_committee(os.urandom(32), b"r" * 32, 8, pool, set(pool[:5]), 2)  # 512 asked, 253 there
    assert len(got) == len(pool) - 5
