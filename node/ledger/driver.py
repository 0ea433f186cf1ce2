"""Driving the pure Tendermint machine (:mod:`node.ledger.core.consensus`) over gossipsub.

One task consumes every consensus event of this validator in order: signed proposals and votes from
``tally/<chain>/consensus`` (signature checked first), its own timers, and "next height" events. It signs what
the machine broadcasts, feeds its own messages back to the machine like anyone else's, re-broadcasts the current
height's messages when the machine has stayed in one round and step for :data:`RESEND_PERIOD` (a healed partition
would otherwise wait forever for messages it lost), then at waits doubling to :data:`RESEND_MAX` while it stays
there, and when the machine decides, stores the block with the > 2/3 precommits that decided it and gossips both.

Re-sends are bounded by what is stuck because they are most of the consensus traffic otherwise: re-broadcasting
every second regardless (as before) was ~80 % of the consensus messages a validator published at load ~10 on two
cores (3.9/s, for 0.25 heights/s), each relayed to every peer, a proposal with its whole block; the nodes' event
loops were then saturated by gossip I/O, messages took 5-9 s, every round timed out and a healed network took up
to 48 s to make two blocks (issue 28's Jepsen stall, the consensus states of seed 1003).

A validator that signs two different votes of one kind at one height and round is reported with an
:class:`~node.ledger.core.tx.Evidence` transaction built from its two signed messages.

Quiet when idle (genesis ``heartbeat_ms`` above ``block_time_ms``): after a decision the machine moves to the
next height without starting round 0 (no proposal, no timeout scheduled) until :func:`node.ledger.core.liveness.
block_due` says a block is due — checked when the block time or heartbeat is due, when a transaction is admitted
(:meth:`ConsensusDriver.tx_added`) and every :data:`IDLE_POLL` seconds as a backstop — or a validator's signed
proposal or vote for that height arrives, whichever comes first (Tendermint's ``create_empty_blocks_interval``,
where ``handleTxsAvailable`` plays the part of the first and a proposal received in ``RoundStepNewRound`` the
part of the second). So on an idle chain no validator's timeouts fire and nobody proposes until the heartbeat,
and validators whose mempools or clocks disagree still meet in round 0.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import trio

from ..encoding import pack
from .consensus_msgs import decode_message, sign_message
from .core.block import Block, InvalidBlock, decode_block
from .core.chain import check_block, check_time, propose
from .core.consensus import (
    PRECOMMIT,
    PREVOTE,
    Broadcast,
    Decide,
    Proposal,
    Schedule,
    Tendermint,
    Timeout,
    Timeouts,
    Vote,
)
from .core.liveness import block_due, height_need, needs_proof
from .core.staking import evidence_of
from .core.state import State
from .core.tx import Evidence, InvalidTx
from .seams import ConsensusLedger

log = logging.getLogger("tally.consensus")

MAX_FUTURE = 2000  # buffered messages for heights we have not reached yet
RESEND_PERIOD = 1.0  # seconds a machine stays in one (height, round, step) before it re-broadcasts its messages
RESEND_MAX = 4.0  # seconds: the longest wait between two re-broadcasts while it stays there (doubling from 1 s)
RESEND_SLACK = 0.05  # seconds: a re-send falls due this early, so that the 1 s loop tick meets it
IDLE_POLL = 1.0  # seconds between two looks at the mempool while a quiet height waits with no wake-up (a backstop:
# a transaction admitted through LedgerService.add_tx wakes the waiting height at once, see tx_added)


class ConsensusDriver:
    """Runs this validator's consensus. ``fault="equivocate"`` is a test switch: from height 3 on, the
    validator also signs a conflicting prevote for the first prevote it casts (double signing), which the
    others must report."""

    def __init__(self, ledger: ConsensusLedger, timeouts: Timeouts | None = None, fault: str | None = None):
        self.ledger = ledger
        self.ident = ledger.ident
        self.chain_id = ledger.chain_id
        self.fault = fault
        self.machine = Tendermint(self.ident.account, ledger.state.valset(), ledger.state.height + 1,
                                  self._get_value, self._valid, timeouts)
        self.blocks: dict[bytes, tuple[Block, State]] = {}  # value id -> (Block, state after it), current height
        self.signed: dict[tuple[str, int, int, bytes], tuple[bytes, bytes]] = {}  # (kind, h, r, sender) -> (v, sig)
        self.future: list[tuple[dict[str, Any], str]] = []  # (message, from peer) of a later height
        self.reported: set[bytes] = set()
        self.decide_times: list[float] = []  # seconds from a height's first proposal to its decision
        self._height_started = time.monotonic()
        self._committing = False
        self.extra_sent: list[dict[str, Any]] = []  # test switch: the double-signed vote, re-sent like the others
        p = ledger.genesis.params
        self.quiet = p.heartbeat() > p.block_time_ms  # wait for a reason before round 0 (module docstring)
        self._idle_height = 0  # the height waiting for a reason to start round 0 (0: none)
        self._idle_need = False  # the head state needs a height (liveness.height_need / needs_proof)
        self._idle_head_ms = 0  # the head block's header time while a quiet height waits
        self._tx_event = trio.Event()  # set by tx_added: a quiet height looks at the mempool again
        self.woken: list[tuple[int, str]] = []  # (height, why round 0 started) of the last quiet heights
        self.timeouts_acted: dict[str, int] = {}  # timeouts that moved the machine, by kind
        self._round_key = (self.machine.height, self.machine.round)  # (height, round) the machine is in
        self._round_since = time.monotonic()  # when the machine entered it
        self._last_commit: float | None = None  # time.monotonic() of the last block this node stored (None: none yet)
        self._resend_key: tuple[int, int, str] | tuple[()] = ()  # (height, round, step) at the last re-send look
        self._resend_at = 0.0  # time.monotonic() from which the current state's messages are re-sent
        self._resend_gap = RESEND_PERIOD  # seconds to the next re-send after that
        self.resends = 0  # re-broadcasts of this height's messages since start
        # events, in order: ("msg", wire map, from peer), ("timeout", Timeout), ("next", height), ("wake", height,
        # why), ("resend",)
        self._send, self._recv = trio.open_memory_channel[tuple[Any, ...]](10_000)
        ledger.on_block(self._on_block)

    # ------------------------------------------------------------------ machine callbacks

    def _get_value(self, height: int) -> bytes:
        st = self.ledger.state
        now = int(self.ledger.clock() * 1000)
        now = max(now, self.ledger.store.head_time_ms() + 1)  # block times never go backwards, nor before genesis
        block, new_state, rejected = propose(st, self.ledger.candidates(), self.ident, now,
                                             self.ledger.store.last_commit(), verified=self.ledger.mempool.verified)
        self.ledger.drop_rejected(rejected)
        self.blocks[block.hash] = (block, new_state)
        return block.hash

    def _valid(self, value: bytes) -> bool:
        return value in self.blocks

    def _on_block(self, block: Block, state: State) -> None:
        """A block committed by sync or from another validator's gossip: move on at once. Our own decisions
        move on ``block_time_ms`` after the decided height started instead, see :meth:`_decide`."""
        self._last_commit = time.monotonic()
        if self._committing:
            return
        if block.height >= self.machine.height:
            try:
                self._send.send_nowait(("next", block.height + 1))
            except trio.WouldBlock:
                log.warning("consensus queue full")

    # ------------------------------------------------------------------ inbound

    def tx_added(self) -> None:
        """A transaction entered the mempool (called by :meth:`LedgerService.add_tx`, in the trio thread): a
        quiet height waiting for a reason looks at once instead of at its next backstop poll."""
        self._tx_event.set()

    def inbound(self, msg: dict[str, Any], from_peer: str) -> None:
        """Queue a consensus message from gossip (checked in the consensus task)."""
        try:
            self._send.send_nowait(("msg", msg, from_peer))
        except trio.WouldBlock:
            log.warning("consensus queue full; dropping a message from %s", from_peer[:16])

    def _senders(self) -> set[bytes]:
        """Who may send consensus messages we keep: the validators of the next two heights (the state knows
        both, :mod:`node.ledger.core.valset`); the machine then checks the set of the message's own height."""
        st = self.ledger.state
        return set(st.valset().accounts) | set(st.next_valset().accounts)

    async def _handle_msg(self, msg: dict[str, Any], from_peer: str) -> None:
        try:
            m = decode_message(msg, self.chain_id, self._senders)
        except ValueError as e:
            log.info("dropped consensus message from %s: %s", from_peer[:16], e)
            return
        if m.height > self.machine.height:
            if len(self.future) < MAX_FUTURE:
                self.future.append((msg, from_peer))
            if m.height > self.ledger.state.height + 2:
                self.ledger.request_sync(from_peer)
            return
        if m.height < self.machine.height:
            return
        if self._idle_height == m.height:  # another validator started this height: join it in round 0
            await self._wake(m.height, "peer")
        if isinstance(m, Proposal):
            if m.value not in self.blocks:
                self._check_proposal(msg, m)
            await self._act(self.machine.on_proposal(m))
        else:
            await self._record_vote(m, msg["sig"])
            await self._act(self.machine.on_vote(m))

    def _check_proposal(self, msg: dict[str, Any], p: Proposal) -> None:
        try:
            block = decode_block(msg.get("block"))
            if block.hash != p.value or block.height != p.height or block.header.proposer != p.sender:
                raise InvalidBlock("proposal does not match its block")
            try:
                # a re-proposal (valid_round >= 0) keeps the time of the block more than 2/3 prevoted in that round,
                # when it was checked: only a new proposal is held to our clock (CometBFT's proposer-based
                # timestamps check timeliness only when POLRound is -1). Otherwise validators locked on a block
                # older than the skew could never decide it nor, locked, anything else (seen on a loaded machine).
                now = int(self.ledger.clock() * 1000) if p.valid_round < 0 else block.header.time_ms
                check_time(block.header.time_ms, now, self.ledger.store.head_time_ms())
            except ValueError as e:
                raise InvalidBlock(str(e)) from None
            # the transactions our mempool admitted are not verified again (check_block)
            self.blocks[block.hash] = (block, check_block(self.ledger.state, block, self.ledger.mempool.verified))
        except (InvalidBlock, InvalidTx, ValueError) as e:
            log.warning("invalid proposal %s/%s from %s: %s", p.height, p.round, p.sender.hex()[:12], e)

    async def _record_vote(self, v: Vote, sig: bytes) -> None:
        key = (v.kind, v.height, v.round, v.sender)
        value = v.value or b""
        prev = self.signed.get(key)
        if prev is None:
            self.signed[key] = (value, sig)
        elif prev[0] != value:
            ev = Evidence(self.chain_id, v.sender, v.kind, v.height, v.round, prev[0], prev[1], value, sig)
            if ev.key not in self.reported and ev.key not in evidence_of(self.ledger.state):
                self.reported.add(ev.key)
                log.warning("validator %s double-signed %s at %d/%d: submitting evidence",
                            v.sender.hex()[:12], v.kind, v.height, v.round)
                try:
                    await self.ledger.submit(ev)
                except InvalidTx as e:
                    log.info("evidence refused: %s", e)

    # ------------------------------------------------------------------ outbound

    def _wire(self, m: Proposal | Vote) -> dict[str, Any]:
        return sign_message(self.ident, self.chain_id, m, self.blocks[m.value][0] if isinstance(m, Proposal) else None)

    async def _publish(self, wire: dict[str, Any]) -> None:
        wire = {**wire, "t": time.time_ns()}  # unsigned: keeps re-broadcasts distinct for gossip de-duplication
        await self.ledger.net.publish(self.ledger.net.topic("consensus"), pack(wire))

    async def _act(self, actions: list[Any]) -> None:
        queue = list(actions)
        while queue:
            a = queue.pop(0)
            if isinstance(a, Broadcast):
                m = a.message
                wire = self._wire(m)
                await self._publish(wire)
                if isinstance(m, Proposal):
                    self._height_started = time.monotonic()
                    queue += self.machine.on_proposal(m)
                else:
                    await self._record_vote(m, wire["sig"])
                    queue += self.machine.on_vote(m)
                    if self.fault == "equivocate" and m.kind == PREVOTE and m.height >= 3:
                        self.fault = None  # once: one double-signed prevote, once the network is running
                        fake = Vote(PREVOTE, m.height, m.round, os.urandom(32), m.sender)
                        self.extra_sent.append(self._wire(fake))
                        await self._publish(self.extra_sent[-1])
            elif isinstance(a, Schedule):
                self._nursery.start_soon(self._timer, a.timeout, a.delay)
            elif isinstance(a, Decide):
                await self._decide(a)

    async def _decide(self, d: Decide) -> None:
        block, new_state = self.blocks[d.value]
        commit = [(s, r, sig) for (k, h, r, s), (v, sig) in self.signed.items()
                  if k == PRECOMMIT and h == d.height and r == d.round and v == d.value]
        self.decide_times.append(time.monotonic() - self._height_started)
        self._committing = True
        try:
            stored = await self.ledger.commit_decided(block, commit, new_state)
        finally:
            self._committing = False
        # the block with its commit, for nodes that did not decide (followers, a validator that missed precommits):
        # in round 0 only its proposer sends it (every validator did: four copies of every block, each relayed to
        # every peer, the largest messages on the topic); after a failed round every validator that decided does,
        # as validators that missed messages are likelier then. A node that gets none pulls it by sync.
        if stored and (d.round > 0 or block.header.proposer == self.ident.account):
            await self._publish({"k": "block", "b": block.to_wire(), "c": [list(x) for x in commit]})
        # the next height starts block_time_ms after this one started, not after its decision: the block time is a
        # cadence, and the height's own work (proposal, votes, fsynced commit) and event-loop latency under load
        # are absorbed instead of added to every interval (measured: 262 ms intervals at 250 ms idle, 288 ms
        # while 1,000 refused transactions arrived). A height slower than the block time starts the next at once.
        due = self._height_started + self.ledger.genesis.params.block_time_ms / 1000
        self._nursery.start_soon(self._next_after, d.height + 1, max(0.0, due - time.monotonic()))

    async def _timer(self, t: Timeout, delay: float) -> None:
        await trio.sleep(delay)
        await self._send.send(("timeout", t))

    async def _next_after(self, height: int, delay: float) -> None:
        await trio.sleep(delay)
        await self._send.send(("next", height))

    async def _resend_loop(self) -> None:
        while True:
            await trio.sleep(RESEND_PERIOD)
            await self._send.send(("resend",))

    # ------------------------------------------------------------------ main loop

    async def run(self) -> None:
        wait = self.ledger.genesis.genesis_time_ms / 1000 - self.ledger.clock()
        if self.ledger.state.height == 0 and wait > 0:  # no block may be older than its chain (Tendermint's
            log.info("waiting %.0f s for the genesis time", wait)  # genesis_time): start consensus then
            await trio.sleep(wait)
        async with trio.open_nursery() as n:
            self._nursery = n
            n.start_soon(self._resend_loop)
            if self.quiet:
                self._go_idle(self.machine.height)
            else:
                await self._act(self.machine.start())
            async for ev in self._recv:
                if ev[0] == "msg":
                    await self._handle_msg(ev[1], ev[2])
                elif ev[0] == "timeout":
                    actions = self.machine.on_timeout(ev[1])
                    if actions:
                        self.timeouts_acted[ev[1].kind] = self.timeouts_acted.get(ev[1].kind, 0) + 1
                    await self._act(actions)
                elif ev[0] == "wake":
                    await self._wake(ev[1], ev[2])
                elif ev[0] == "next":
                    await self._next_height()
                elif ev[0] == "resend":
                    if self._resend_due(time.monotonic()):
                        for a in self.machine.resend():
                            await self._publish(self._wire(a.message))
                    for wire in self.extra_sent:
                        if wire["h"] == self.machine.height:
                            await self._publish(wire)
                self._observe()

    def _resend_due(self, now: float) -> bool:
        """Whether to re-broadcast this height's messages now (``now``: ``time.monotonic()`` seconds): only while
        the machine has stayed in one (height, round, step) for :data:`RESEND_PERIOD`, then again after waits
        doubling to :data:`RESEND_MAX` while it stays there. A machine that moves needs no re-sends (its peers
        got what it sent), and a stuck one is re-sent to at a bounded rate (see the module docstring)."""
        m = self.machine
        key = (m.height, m.round, m.step)
        if key != self._resend_key:
            self._resend_key, self._resend_gap = key, RESEND_PERIOD
            self._resend_at = now + RESEND_PERIOD - RESEND_SLACK
            return False
        if now < self._resend_at:
            return False
        self._resend_gap = min(2 * self._resend_gap, RESEND_MAX)
        self._resend_at = now + self._resend_gap - RESEND_SLACK
        self.resends += 1
        return True

    async def _next_height(self) -> None:
        target = self.ledger.state.height + 1
        if target <= self.machine.height:
            return  # already working on it
        self.blocks.clear()
        self.signed = {k: v for k, v in self.signed.items() if k[1] >= target}
        self._height_started = time.monotonic()
        vs = self.ledger.state.valset()  # the set of the height being decided, from the state
        if self.quiet:
            self.machine.next_height(target, start=False, validators=vs)
            self._go_idle(target)
        else:
            await self._act(self.machine.next_height(target, validators=vs))
        pending, self.future = self.future, []
        for msg, peer in pending:
            await self._handle_msg(msg, peer)

    # ------------------------------------------------------------------ observing

    def _observe(self) -> None:
        """Note when the machine entered its current (height, round), for :meth:`status`."""
        key = (self.machine.height, self.machine.round)
        if key != self._round_key:
            if key[1] > 0:  # only after a failed round: a post-mortem of a stall reads who moved when
                m = self.machine
                log.info("height %d: round %d after %.1f s in round %d (step %s, locked round %d, valid round %d)",
                         key[0], key[1], time.monotonic() - self._round_since, self._round_key[1], m.step,
                         m.locked_round, m.valid_round)
            self._round_key, self._round_since = key, time.monotonic()

    def status(self) -> dict[str, Any]:
        """This validator's consensus state for ``/v1/status``: the height and round the machine is in, its step
        (``idle``: a quiet height waiting for a reason to start round 0), seconds in this round and since the last
        stored block (None: none since start), the round's proposer (account bytes), the voting power of the
        prevotes and precommits seen in this round (any value) against the quorum and total power, the lock
        (Tendermint's lockedRound/validRound, -1: none), the power seen in each higher round (line 55 jumps at
        f + 1), the timeouts that moved the machine, by kind, the rounds of timeout carried from the last heights
        (:attr:`Tendermint.lag`), the re-broadcasts since start, the events waiting for the consensus task and the
        peers in this node's gossip mesh of the consensus topic."""
        self._observe()
        m, t, now = self.machine, self.machine.tally, time.monotonic()
        higher: dict[int, int] = {}
        for r in sorted({k[1] for k in t.votes} | set(t.proposals)):
            if r > m.round:
                higher[r] = sum(m.powers.get(a, 0) for a in t.senders_in_round(r))
        return {
            "height": m.height, "round": m.round,
            "step": "idle" if self._idle_height == m.height else m.step,
            "round_age_s": round(now - self._round_since, 3),
            "last_commit_age_s": None if self._last_commit is None else round(now - self._last_commit, 3),
            "proposer": m.proposer(m.height, m.round),
            "proposal": m.round in t.proposals,
            "prevotes": t.count(PREVOTE, m.round, any_value=True),
            "precommits": t.count(PRECOMMIT, m.round, any_value=True),
            "quorum": m.quorum, "power": m.total,
            "locked_round": m.locked_round, "valid_round": m.valid_round,
            "higher_rounds": [[r, p] for r, p in higher.items()][-8:],
            "timeouts": dict(self.timeouts_acted),
            "timeout_lag": m.lag, "resends": self.resends,
            "queued": self._send.statistics().current_buffer_used,
            "mesh": len(self.ledger.net.mesh_peers(self.ledger.net.topic("consensus"))),
        }

    # ------------------------------------------------------------------ quiet when idle

    def _go_idle(self, height: int) -> None:
        """Wait at ``height`` (the machine moved there without starting round 0) until a block is due."""
        st = self.ledger.state
        need = height_need(st)
        raw = self.ledger.store.get_block_raw(st.height) if st.height else None
        self._idle_need = need is not None or needs_proof(st, raw["b"]["h"][6] if raw else None)
        self._idle_head_ms = int(raw["b"]["h"][3]) if raw else self.ledger.genesis.genesis_time_ms
        self._idle_height = height
        self._nursery.start_soon(self._idle_watch, height)

    def _block_due(self) -> bool:
        return block_due(self.ledger.genesis.params, int(self.ledger.clock() * 1000), self._idle_head_ms,
                         bool(self.ledger.candidates()), self._idle_need)

    def _idle_wait(self) -> float:
        """Seconds from now until :meth:`_block_due` can next turn true without a new transaction: the block time
        after the head when the state needs a height or transactions are ready, else the heartbeat after it;
        at most :data:`IDLE_POLL`."""
        p = self.ledger.genesis.params
        soon = self._idle_need or bool(self.ledger.candidates())
        due_ms = self._idle_head_ms + (p.block_time_ms if soon else p.heartbeat())
        return min(IDLE_POLL, max(0.0, due_ms / 1000 - self.ledger.clock()))

    async def _idle_watch(self, height: int) -> None:
        """Until a block is due at ``height`` (or round 0 started otherwise): sleep until it can be due
        (:meth:`_idle_wait`) or a transaction is admitted (:meth:`tx_added`), whichever comes first, then look.
        Bounded: ``heartbeat_ms`` after the head a block is always due. (It polled every 50 ms before, 20
        wake-ups a second on an idle validator: about a fifth of its idle CPU, measured with bench/idle.py.)"""
        while self._idle_height == height:
            if self._block_due():
                why = ("state" if self._idle_need else "txs" if self.ledger.candidates() else "heartbeat")
                await self._send.send(("wake", height, why))
                return
            if self._tx_event.is_set():
                self._tx_event = trio.Event()
            with trio.move_on_after(self._idle_wait() + 0.001):  # 1 ms past the due time: due by then
                await self._tx_event.wait()

    async def _wake(self, height: int, why: str) -> None:
        """Start round 0 of the quiet ``height`` (``why``: state, txs, heartbeat or peer)."""
        if self._idle_height != height or self.machine.height != height:
            return
        self._idle_height = 0
        self.woken = self.woken[-99:] + [(height, why)]
        self._height_started = time.monotonic()
        await self._act(self.machine.start())
