"""Beacon sampling, adaptive probability, committee selection and the > 2/3 tally (pure)."""

from __future__ import annotations

import os

from node.encoding import H
from node.ledger.core.committee import deadlocked, select_committee, tally
from node.ledger.core.sampling import PPM, is_sampled, sampling_ppm
from node.ledger.core.tx import ABSTAIN, INVALID, VALID


def test_sampling_rate_matches_probability():
    beacon = H(b"block")
    n = 20_000
    for p in (10_000, 50_000, 500_000):
        hits = sum(is_sampled(beacon, i.to_bytes(32, "big"), p) for i in range(n))
        expected = n * p / PPM
        assert abs(hits - expected) < 5 * (expected * (1 - p / PPM)) ** 0.5


def test_sampling_depends_on_beacon_and_extremes():
    rid = os.urandom(32)
    assert is_sampled(b"x", rid, PPM) and not is_sampled(b"x", rid, 0)
    outcomes = {is_sampled(H(bytes([i])), rid, PPM // 2) for i in range(64)}
    assert outcomes == {True, False}  # unpredictable without the beacon


def test_adaptive_probability_halves_with_valid_runs_and_respects_floor():
    assert sampling_ppm(PPM, 10_000, 0, 10) == PPM
    assert sampling_ppm(PPM, 10_000, 10, 10) == PPM // 2
    assert sampling_ppm(PPM, 10_000, 25, 10) == PPM // 4
    assert sampling_ppm(PPM, 10_000, 10_000, 10) == 10_000
    assert sampling_ppm(PPM, 10_000, 0, 10) == PPM  # reset after an invalid verdict (valid_run = 0)


def test_committee_excludes_worker_and_requester_and_is_deterministic():
    members = [bytes([i]) * 32 for i in range(10)]
    beacon, rid = H(b"b"), H(b"r")
    c = select_committee(beacon, rid, 0, members, [members[0], members[1]], 3)
    assert len(c) == 3 and members[0] not in c and members[1] not in c
    assert c == select_committee(beacon, rid, 0, list(reversed(members)), [members[0], members[1]], 3)
    assert len(select_committee(beacon, rid, 1, members, [members[0]], 3)) == 6  # escalation doubles
    assert select_committee(beacon, rid, 0, members[:2], members[:2], 3) == ()


def test_tally_needs_more_than_two_thirds():
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    assert tally({a: VALID, b: VALID}, 3) is None  # 2/3 is not > 2/3
    assert tally({a: VALID, b: VALID, c: VALID}, 3) == VALID
    assert tally({a: INVALID, b: INVALID}, 2) == INVALID
    assert tally({a: VALID, b: INVALID}, 2) is None
    assert tally({a: ABSTAIN, b: VALID}, 2) is None
    assert deadlocked({a: ABSTAIN, b: VALID}, 2) and not deadlocked({a: VALID}, 2)
