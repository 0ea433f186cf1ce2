"""Tendermint consensus as a pure state machine (Buchman, Kwon, Milosevic 2018, arXiv:1807.04938, Algorithm 1).

The machine is fed events — :class:`Proposal`, :class:`Vote` (prevote or precommit) and :class:`Timeout` — and
returns actions — :class:`Broadcast` a message, :class:`Schedule` a timeout, :class:`Decide` a value. It does no
I/O, keeps no clock and checks no signatures: the driver (:mod:`node.ledger.service`) verifies signatures before
feeding messages in, signs what the machine broadcasts, runs the timers, and feeds the machine's own messages back
to it like anyone else's. Line numbers in comments refer to Algorithm 1 of the paper.

Values are opaque 32-byte ids (block hashes); the driver supplies ``get_value(height)`` for the proposer and
``valid(value_id)`` for everyone. ``None`` is nil. Votes are weighed by voting power
(:class:`~node.ledger.core.valset.ValidatorSet`; one vote each on a genesis-fixed set): with total power ``T``,
``f = (T − 1) // 3`` faulty power is tolerated, a quorum is ``T − f`` (``2f + 1`` when T = 3f + 1: more than 2/3
of the power) and "f + 1" (line 55) is ``f + 1`` of power. The set may change from one height to the next
(:meth:`Tendermint.next_height`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .valset import ValidatorSet

PROPOSE, PREVOTE, PRECOMMIT = "propose", "prevote", "precommit"


@dataclass(frozen=True)
class Proposal:
    height: int
    round: int
    value: bytes
    valid_round: int  # -1 when the proposer was not locked on a valid value
    sender: bytes


@dataclass(frozen=True)
class Vote:
    kind: str  # PREVOTE or PRECOMMIT
    height: int
    round: int
    value: bytes | None  # None is nil
    sender: bytes


@dataclass(frozen=True)
class Timeout:
    kind: str  # PROPOSE, PREVOTE or PRECOMMIT
    height: int
    round: int


@dataclass(frozen=True)
class Broadcast:
    message: Proposal | Vote


@dataclass(frozen=True)
class Schedule:
    timeout: Timeout
    delay: float  # seconds


@dataclass(frozen=True)
class Decide:
    height: int
    round: int
    value: bytes


@dataclass
class Timeouts:
    """Timeout durations in seconds, growing linearly with the round (paper §4, "timeouts")."""

    propose: float = 1.0
    prevote: float = 0.5
    precommit: float = 0.5
    delta: float = 0.5

    def of(self, kind: str, round_: int) -> float:
        base = {PROPOSE: self.propose, PREVOTE: self.prevote, PRECOMMIT: self.precommit}[kind]
        return base + self.delta * round_


MAX_LAG = 16  # rounds: the most a height's timeouts start above round 0's (propose 1 s + 16 x 0.5 s = 9 s)


@dataclass
class _Tally:
    proposals: dict[int, Proposal] = field(default_factory=dict)  # round -> first proposal from the proposer
    votes: dict[tuple[str, int], dict[bytes, bytes | None]] = field(default_factory=dict)  # (kind, r) -> sender -> v
    powers: dict[bytes, int] = field(default_factory=dict)  # sender -> voting power

    def add(self, v: Vote) -> bool:
        box = self.votes.setdefault((v.kind, v.round), {})
        if v.sender in box:
            return False  # one vote per sender per (kind, round); equivocation is handled by the driver
        box[v.sender] = v.value
        return True

    def count(self, kind: str, round_: int, value: bytes | None = None, any_value: bool = False) -> int:
        """Voting power of the senders of ``kind`` votes in ``round_`` (for ``value``, or for any value)."""
        box = self.votes.get((kind, round_), {})
        return sum(self.powers.get(s, 0) for s, x in box.items() if any_value or x == value)

    def senders_in_round(self, round_: int) -> set[bytes]:
        s = {p.sender for r, p in self.proposals.items() if r == round_}
        for (_kind, r), box in self.votes.items():
            if r == round_:
                s |= set(box)
        return s


class Tendermint:
    """One validator's consensus state for successive heights.

    Args:
        me: this validator's account (None for a non-validator that only watches decisions).
        validators: the validator set of ``height``: a :class:`ValidatorSet` or accounts with one vote each.
        height: the first height to decide.
        get_value: ``get_value(height) -> value id`` for a proposal (the driver builds the block).
        valid: ``valid(value_id) -> bool``; False also when the value's content is unknown.
        timeouts: :class:`Timeouts`.
    """

    def __init__(self, me: bytes | None, validators: tuple[bytes, ...] | ValidatorSet, height: int,
                 get_value: Callable[[int], bytes], valid: Callable[[bytes], bool], timeouts: Timeouts | None = None):
        self.me = me
        self._use(validators)
        self.get_value, self.valid = get_value, valid
        self.timeouts = timeouts or Timeouts()
        self.height = height
        # rounds added to every timeout of this height: the timeouts that last decided, carried to the next height
        # (see next_height); 0 on a network that decides in round 0
        self.lag = 0
        self._reset()

    def _use(self, validators: tuple[bytes, ...] | ValidatorSet) -> None:
        vs = validators if isinstance(validators, ValidatorSet) else ValidatorSet.equal(validators)
        self.valset = vs
        self.validators = vs.accounts
        self.powers = vs.powers
        self.n = len(vs)
        self.total = vs.total
        self.f = (self.total - 1) // 3  # faulty power tolerated
        self.quorum = self.total - self.f  # 2f + 1 when total = 3f + 1: more than 2/3 of the power

    def _reset(self) -> None:
        self.round = 0
        self.step = PROPOSE
        self.locked_value: bytes | None = None
        self.locked_round = -1
        self.valid_value: bytes | None = None
        self.valid_round = -1
        self.tally = _Tally(powers=self.powers)
        self._once: set[tuple[Any, ...]] = set()
        self.decided: bytes | None = None
        self.decided_round = -1
        self.sent: list[Any] = []  # our own messages at this height, for re-broadcast

    def timeout(self, kind: str, round_: int) -> float:
        """Seconds of the ``kind`` timeout in ``round_`` of this height: :meth:`Timeouts.of` at ``round_`` +
        :attr:`lag`. Still increasing with the round, as the paper's liveness argument needs (§4: after GST
        every timeout eventually exceeds the message delay)."""
        return self.timeouts.of(kind, round_ + self.lag)

    def proposer(self, height: int, round_: int) -> bytes:
        """Round-robin proposer selection over the sorted validator set (:meth:`ValidatorSet.proposer`)."""
        return self.valset.proposer(height, round_)

    # ------------------------------------------------------------------ entry points

    def start(self) -> list[Any]:
        """Start round 0 of the current height."""
        return self._start_round(0)

    def on_proposal(self, p: Proposal) -> list[Any]:
        if p.height != self.height or p.sender != self.proposer(p.height, p.round) or p.round in self.tally.proposals:
            return []
        self.tally.proposals[p.round] = p
        return self._progress(p.round)

    def on_vote(self, v: Vote) -> list[Any]:
        if v.height != self.height or v.sender not in self.validators or v.kind not in (PREVOTE, PRECOMMIT):
            return []
        if not self.tally.add(v):
            return []
        return self._progress(v.round)

    def on_timeout(self, t: Timeout) -> list[Any]:
        if t.height != self.height or t.round != self.round:
            return []
        if t.kind == PROPOSE and self.step == PROPOSE:  # line 57
            return self._set_step(PREVOTE, self._vote(PREVOTE, None))
        if t.kind == PREVOTE and self.step == PREVOTE:  # line 61
            return self._set_step(PRECOMMIT, self._vote(PRECOMMIT, None))
        if t.kind == PRECOMMIT:  # line 65
            return self._start_round(self.round + 1)
        return []

    def on_value_ready(self) -> list[Any]:
        """Call when a value that was unknown (``valid`` returned False for lack of content) may now be valid."""
        return self._progress(self.round)

    # ------------------------------------------------------------------ internals

    def _set_step(self, step: str, actions: list[Any]) -> list[Any]:
        self.step = step
        return actions

    def _vote(self, kind: str, value: bytes | None) -> list[Any]:
        if self.me is None or self.me not in self.validators:
            return []
        msg = Vote(kind, self.height, self.round, value, self.me)
        self.sent.append(msg)
        return [Broadcast(msg)]

    def resend(self) -> list[Any]:
        """Our messages of the current height again. The paper assumes every message of a correct process
        eventually reaches every correct process; after a partition heals, lost messages arrive only if they
        are sent again, so the driver calls this periodically (receivers ignore duplicates)."""
        return [Broadcast(m) for m in self.sent if m.round >= self.round - 1]

    def _start_round(self, r: int) -> list[Any]:  # line 11
        self.round, self.step = r, PROPOSE
        if self.me is not None and self.proposer(self.height, r) == self.me:
            value = self.valid_value if self.valid_value is not None else self.get_value(self.height)
            msg = Proposal(self.height, r, value, self.valid_round, self.me)
            self.sent.append(msg)
            return [Broadcast(msg)]
        return [Schedule(Timeout(PROPOSE, self.height, r), self.timeout(PROPOSE, r))]

    def _first(self, key: tuple[Any, ...]) -> bool:
        if key in self._once:
            return False
        self._once.add(key)
        return True

    def _progress(self, r_msg: int) -> list[Any]:
        """Apply every rule of Algorithm 1 whose condition holds, until none fires."""
        out: list[Any] = []
        while True:
            step = self._fire(r_msg)
            if step is None:
                return out
            out += step

    def _fire(self, r_msg: int) -> list[Any] | None:
        h, r, t = self.height, self.round, self.tally
        q = self.quorum
        if self.decided is not None:
            return None
        # line 49: decide on a proposal with a precommit quorum in any round
        for rr, pr in sorted(t.proposals.items()):
            if t.count(PRECOMMIT, rr, pr.value) >= q and self.valid(pr.value):
                self.decided, self.decided_round = pr.value, rr
                return [Decide(h, rr, pr.value)]
        p = t.proposals.get(r)
        if p is not None and self.step == PROPOSE:
            if p.valid_round == -1:  # line 22
                ok = self.valid(p.value) and (self.locked_round == -1 or self.locked_value == p.value)
                return self._set_step(PREVOTE, self._vote(PREVOTE, p.value if ok else None))
            if 0 <= p.valid_round < r and t.count(PREVOTE, p.valid_round, p.value) >= q:  # line 28
                ok = self.valid(p.value) and (self.locked_round <= p.valid_round or self.locked_value == p.value)
                return self._set_step(PREVOTE, self._vote(PREVOTE, p.value if ok else None))
        if self.step == PREVOTE and t.count(PREVOTE, r, any_value=True) >= q and self._first(("l34", h, r)):
            return [Schedule(Timeout(PREVOTE, h, r), self.timeout(PREVOTE, r))]  # line 34
        if p is not None and self.step in (PREVOTE, PRECOMMIT) and t.count(PREVOTE, r, p.value) >= q \
                and self.valid(p.value) and self._first(("l36", h, r)):  # line 36
            out: list[Any] = []
            if self.step == PREVOTE:
                self.locked_value, self.locked_round = p.value, r
                out = self._set_step(PRECOMMIT, self._vote(PRECOMMIT, p.value))
            self.valid_value, self.valid_round = p.value, r
            return out
        if self.step == PREVOTE and t.count(PREVOTE, r, None) >= q:  # line 44
            return self._set_step(PRECOMMIT, self._vote(PRECOMMIT, None))
        if t.count(PRECOMMIT, r, any_value=True) >= q and self._first(("l47", h, r)):  # line 47
            return [Schedule(Timeout(PRECOMMIT, h, r), self.timeout(PRECOMMIT, r))]
        # line 55: f + 1 validators are already in a higher round: skip ahead
        for rr in sorted({k[1] for k in t.votes} | set(t.proposals)):
            if rr > r and sum(self.powers.get(a, 0) for a in t.senders_in_round(rr)) >= self.f + 1:
                return self._start_round(rr)
        return None

    def next_height(self, height: int, start: bool = True,
                    validators: tuple[bytes, ...] | ValidatorSet | None = None) -> list[Any]:
        """Move to ``height`` after a decision was committed (line 54) and start round 0. With ``start`` False
        the machine waits at ``height`` without proposing or scheduling anything until :meth:`start` (a quiet
        chain, :mod:`node.ledger.core.liveness`: Tendermint's ``create_empty_blocks_interval`` waits the same way
        before round 0's propose step); the driver must call :meth:`start` before feeding it messages.
        ``validators``: the set of ``height`` when it differs from the last one's."""
        self.height = height
        if validators is not None:
            self._use(validators)
        # Timeouts carried over: a height that needed r more rounds (decided in round r here, or left in round r
        # when the decision came by sync) starts the next height r rounds of timeout higher; one decided in round 0
        # lowers it by one round. Timeouts that reset at every height (as in the paper and CometBFT) make every
        # height climb through the same failed rounds again while messages take longer than round 0's timeouts
        # (seconds on a loaded machine); carried, a slow network costs rounds once and the timeouts come back down
        # one round per height that decides at once. Timeouts bear on liveness only, never on safety.
        seen = self.decided_round if self.decided is not None else self.round
        self.lag = min(MAX_LAG, self.lag + seen if seen > 0 else max(0, self.lag - 1))
        self._reset()
        return self._start_round(0) if start else []
