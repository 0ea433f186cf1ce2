"""The pure Tendermint machine in a discrete-event simulation: random delays and reordering, a crashed
validator, a partition that heals, locks across rounds. Safety: no two validators decide differently at a
height. Liveness: with n - f correct, connected validators, every height decides."""

from __future__ import annotations

import heapq
import random

import pytest
from hypothesis import given, settings, strategies as st

from node.ledger.core.consensus import (
    MAX_LAG,
    PRECOMMIT,
    PREVOTE,
    PROPOSE,
    Broadcast,
    Decide,
    Proposal,
    Schedule,
    Tendermint,
    Timeout,
    Timeouts,
    Vote,
)

VALS = tuple(bytes([i]) * 32 for i in range(4))


class Sim:
    def __init__(self, n=4, seed=0, crashed=(), max_delay=0.05, heights=3, invalid_from=()):
        self.rng = random.Random(seed)
        self.vals = VALS[:n]
        self.crashed = set(crashed)
        self.max_delay = max_delay
        self.heights = heights
        self.invalid_from = set(invalid_from)  # proposers whose values nobody accepts
        self.now = 0.0
        self.q: list = []
        self.seq = 0
        self.decisions: dict[bytes, dict[int, bytes]] = {v: {} for v in self.vals}
        self.blocked: set[tuple[bytes, bytes]] = set()
        self.m = {}
        for v in self.vals:
            self.m[v] = Tendermint(v, self.vals, 1, get_value=lambda h, v=v: b"V" + v[:1] + bytes([h]) + b"\0" * 29,
                                   valid=lambda x: x[1:2] not in {p[:1] for p in self.invalid_from},
                                   timeouts=Timeouts(0.2, 0.1, 0.1, 0.1))

    def push(self, t, who, ev):
        self.seq += 1
        heapq.heappush(self.q, (t, self.seq, who, ev))

    def act(self, who, actions):
        for a in actions:
            if isinstance(a, Broadcast):
                for dst in self.vals:
                    if (who, dst) in self.blocked:
                        continue
                    delay = 0 if dst == who else self.rng.uniform(0, self.max_delay)
                    self.push(self.now + delay, dst, a.message)
            elif isinstance(a, Schedule):
                self.push(self.now + a.delay, who, a.timeout)
            elif isinstance(a, Decide):
                assert a.height not in self.decisions[who]
                self.decisions[who][a.height] = a.value
                if a.height < self.heights:
                    self.push(self.now + 0.01, who, ("next", a.height + 1))

    def deliver(self, who, ev):
        if who in self.crashed:
            return
        m = self.m[who]
        if isinstance(ev, Proposal):
            self.act(who, m.on_proposal(ev))
        elif isinstance(ev, Vote):
            self.act(who, m.on_vote(ev))
        elif isinstance(ev, Timeout):
            self.act(who, m.on_timeout(ev))
        elif ev[0] == "next":
            self.act(who, m.next_height(ev[1]))
        elif ev[0] == "resend":
            self.act(who, m.resend())
            if self.now < 150 and len(self.decisions[who]) < self.heights:
                self.push(self.now + 1.0, who, ("resend",))

    def run(self, until=60.0, start=True):
        if start:
            for v in self.vals:
                if v not in self.crashed:
                    self.act(v, self.m[v].start())
                    self.push(self.now + 1.0, v, ("resend",))
        while self.q and self.now < until:
            self.now, _, who, ev = heapq.heappop(self.q)
            # messages for later heights wait until the receiver gets there (the driver buffers them)
            if isinstance(ev, (Proposal, Vote)) and ev.height > self.m[who].height:
                self.push(self.now + 0.05, who, ev)
                continue
            self.deliver(who, ev)
        return self

    def agreed(self):
        by_height: dict[int, set] = {}
        for d in self.decisions.values():
            for h, v in d.items():
                by_height.setdefault(h, set()).add(v)
        assert all(len(s) == 1 for s in by_height.values()), by_height
        return by_height


def correct(sim):
    return [v for v in sim.vals if v not in sim.crashed]


def test_four_validators_decide_every_height():
    sim = Sim(seed=1).run()
    sim.agreed()
    assert all(len(sim.decisions[v]) == sim.heights for v in sim.vals)


def test_single_validator_finalizes_alone():
    sim = Sim(n=1).run()
    assert len(sim.decisions[VALS[0]]) == sim.heights


@pytest.mark.parametrize("seed", range(5))
def test_one_crashed_validator_does_not_stop_the_others(seed):
    sim = Sim(seed=seed, crashed={VALS[seed % 4]}).run()
    sim.agreed()
    assert all(len(sim.decisions[v]) == sim.heights for v in correct(sim))


def test_two_crashed_of_four_decides_nothing():
    sim = Sim(crashed={VALS[0], VALS[1]}).run(until=10)
    assert all(not d for d in sim.decisions.values())


def test_partition_two_two_then_heal():
    sim = Sim(seed=3)
    a, b = set(VALS[:2]), set(VALS[2:])
    sim.blocked = {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}
    sim.run(until=5)
    assert all(not d for d in sim.decisions.values())
    sim.blocked = set()  # heal: later messages flow (earlier ones were lost); timeouts drive new rounds
    sim.run(until=120)
    sim.agreed()
    assert all(len(sim.decisions[v]) == sim.heights for v in sim.vals)


def test_invalid_proposals_are_skipped_by_later_rounds():
    sim = Sim(seed=4, invalid_from={VALS[1]}).run()
    by_height = sim.agreed()
    assert all(len(sim.decisions[v]) == sim.heights for v in sim.vals)
    assert all(v[1:2] != VALS[1][:1] for s in by_height.values() for v in s)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.001, 0.5), st.sets(st.sampled_from(VALS), max_size=1))
def test_safety_and_liveness_under_random_delays(seed, max_delay, crashed):
    sim = Sim(seed=seed, max_delay=max_delay, crashed=crashed).run(until=200)
    sim.agreed()
    assert all(len(sim.decisions[v]) == sim.heights for v in correct(sim))


def test_votes_from_non_validators_and_duplicates_are_ignored():
    m = Tendermint(VALS[0], VALS, 1, get_value=lambda h: b"x" * 32, valid=lambda v: True)
    m.start()
    outsider = b"\xff" * 32
    assert m.on_vote(Vote(PREVOTE, 1, 0, b"x" * 32, outsider)) == []
    m.on_vote(Vote(PRECOMMIT, 1, 0, b"x" * 32, VALS[1]))
    assert m.on_vote(Vote(PRECOMMIT, 1, 0, b"y" * 32, VALS[1])) == []  # second vote of a sender ignored
    assert m.tally.count(PRECOMMIT, 0, b"x" * 32) == 1


def _decide(m: Tendermint, round_: int) -> list:
    """Feed ``m`` the proposal of ``round_`` at its height and precommits for it from three of the four."""
    value = bytes([m.height]) * 32
    m.on_proposal(Proposal(m.height, round_, value, -1, m.proposer(m.height, round_)))
    out = []
    for v in VALS[1:]:
        out += m.on_vote(Vote(PRECOMMIT, m.height, round_, value, v))
    return out


def test_timeouts_carry_over_to_the_next_height_and_come_down_one_round_per_quick_height():
    t = Timeouts()
    m = Tendermint(VALS[0], VALS, 1, get_value=lambda h: bytes([h]) * 32, valid=lambda v: True, timeouts=t)
    m.start()
    assert m.timeout(PROPOSE, 0) == t.of(PROPOSE, 0)
    assert any(isinstance(a, Decide) and a.round == 3 for a in _decide(m, 3))  # height 1 needed 4 rounds
    m.next_height(2)
    assert m.lag == 3 and m.timeout(PROPOSE, 0) == t.of(PROPOSE, 3) and m.timeout(PREVOTE, 1) == t.of(PREVOTE, 4)
    _decide(m, 2)  # still slow: two more rounds on top of the carried three
    m.next_height(3)
    assert m.lag == 5
    for h, lag in ((4, 4), (5, 3), (6, 2), (7, 1), (8, 0), (9, 0)):  # each height decided in round 0
        _decide(m, 0)
        m.next_height(h)
        assert m.lag == lag, (h, m.lag)
    m.round = 40  # a height left in round 40 by a decision that came by sync: capped
    m.next_height(10)
    assert m.lag == MAX_LAG and m.timeout(PROPOSE, 0) == t.of(PROPOSE, MAX_LAG)


def test_timeouts_grow_with_the_round_within_a_height_whatever_was_carried():
    m = Tendermint(VALS[0], VALS, 1, get_value=lambda h: bytes([h]) * 32, valid=lambda v: True)
    m.lag = 7
    for kind in (PROPOSE, PREVOTE, PRECOMMIT):
        assert all(m.timeout(kind, r) < m.timeout(kind, r + 1) for r in range(20))
