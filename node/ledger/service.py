"""The ledger at the edge: store, mempool, block production (validator), block gossip and sync.

Runs on the node's trio loop. The state transition itself is pure (:mod:`node.ledger.core.state`); this module only
moves bytes: transactions from gossip, from the direct-submit protocol and from local callers into the mempool
(:mod:`node.ledger.mempool`: admission rules, caps, priority, the reason of every refusal), blocks from the
validator to the followers (``tally/<chain>/consensus`` gossip plus a pull-based sync protocol for late or
restarted nodes). Validators finalize blocks with Tendermint (:mod:`node.ledger.driver`); every node checks
each block's commit against the validator set of its height (:mod:`node.ledger.core.valset`) before storing it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from ..encoding import DecodeError, pack, unpack
from ..identity import Identity, account_to_str
from ..p2p.budget import Busy, ReplyBudget, Reservation
from ..p2p.filesend import reply_deadline
from ..p2p.framing import MAX_MESSAGE, error_reply, read_msg, write_msg
from .core.block import Block, InvalidBlock, decode_block
from .core.chain import check_and_apply
from .core.state import State
from .core.tx import InvalidTx, Tx, decode_tx
from .driver import ConsensusDriver
from .genesis import Genesis
from .mempool import Mempool
from .mempool_policy import Limits, Priority, priority
from .outbox import RESEND_FIRST, Outbox, ResendSchedule, outbox_path
from .seams import LedgerHost, MsgStream
from .store import LedgerStore
from .txstatus import TxState, TxStatus

log = logging.getLogger("tally.ledger")

SYNC_PROTOCOL = "/tally/sync/1.0.0"
SUBMIT_PROTOCOL = "/tally/submit/1.0.0"
MAX_TX_WIRE = 1 << 16  # bytes of one transaction on the wire (gossip, submit)
SYNC_BATCH = 64  # blocks in one sync reply, at most
SYNC_REPLY_BYTES = 16 << 20  # bytes of blocks in one sync reply, at most (always at least one block)
REPLY_TIMEOUT = 5.0  # seconds to write a small reply (a submit's answer, an error)
SYNC_POLL_MAX = 30.0  # seconds: the longest wait before a follower with no new block asks its validators
RESEND_LOOK = 1.0  # seconds between two looks at which local pending transactions are due for a re-send


class LedgerService:
    """Owns the :class:`LedgerStore` and the current :class:`State` of one node."""

    def __init__(self, store: LedgerStore, genesis: Genesis, ident: Identity, host: LedgerHost | None,
                 clock: Callable[[], float] = time.time, consensus_fault: str | None = None,
                 mempool_limits: Limits = Limits()):  # noqa: B008 - frozen: one shared default is safe
        self.store, self.genesis, self.ident, self.host = store, genesis, ident, host
        self.clock = clock
        self.state: State = store.replay()
        self.parent_state: State = store.parent_state  # the state the head header's state_root commits to
        self.mempool = Mempool(self.state, mempool_limits)
        self._mempool_limits = mempool_limits
        self.new_block = trio.Event()
        self._lock = trio.Lock()
        self._listeners: list[Callable[[Block, State], None]] = []
        self._sync_requests, self._sync_requests_recv = trio.open_memory_channel[str](64)  # peers to sync from
        self.drop: Callable[[str], bool] | None = None  # test hook: ignore consensus traffic from these peers
        self._resend = ResendSchedule()  # local pending transactions: when each is next re-sent
        self._outbox = Outbox(outbox_path(store))  # local pending account transactions, kept over a crash
        self._caught_up = False  # sync pulled blocks since the last resend look
        self._known_peers: frozenset[str] = frozenset()  # connected validators at the last resend look
        self.reply_budget = ReplyBudget()  # sync replies' memory, per peer and node-wide (a node shares its own)
        self.driver: ConsensusDriver | None = None
        if self.is_validator or genesis.params.min_validator_bond:  # a node that may join the set later
            self.driver = ConsensusDriver(self, fault=consensus_fault)  # runs the machine too: votes once a member

    def reset_to(self, state: State) -> None:
        """Take ``state`` (just installed by state sync, :func:`node.ledger.statesync.state_sync`) as the head,
        with an empty mempool (:meth:`run` then queues the outbox's transactions again). Only before :meth:`run`
        starts."""
        self.state, self.parent_state = state, self.store.parent_state
        self.mempool = Mempool(state, self._mempool_limits)

    @property
    def is_validator(self) -> bool:
        """This node's account is in the validator set of the next height (which changes with bonds on a chain
        whose genesis sets ``min_validator_bond``, :mod:`node.ledger.core.valset`)."""
        return self.ident.account in self.state.valset()

    @property
    def net(self) -> LedgerHost:
        """The host this service gossips and syncs through.

        Raises:
            AttributeError: the service was made without one (``host=None``: no network, as in tests).
        """
        if self.host is None:
            raise AttributeError("this ledger service has no host (made with host=None)")
        return self.host

    @property
    def chain_id(self) -> str:
        """The signing domain every transaction and vote of this network carries: ``"<chain id>/<genesis hash
        hex>"`` (:attr:`node.ledger.core.genesis.Genesis.domain`), not the bare chain id of topics and hello."""
        return self.genesis.domain

    def on_block(self, fn: Callable[[Block, State], None]) -> None:
        """Register ``fn(block, new_state)``, called after each block is stored."""
        self._listeners.append(fn)

    # ---------------------------------------------------------------- transactions

    def add_tx(self, tx: Tx, peer: str | None = None) -> bytes:
        """Admit a transaction into the mempool (from gossip or direct-submit ``peer``, or a local caller when
        None): checked against the pending state, nonce window, caps and budgets, its signatures verified once
        (:mod:`node.ledger.mempool`). Returns its id; an already queued transaction is a no-op.

        Raises:
            InvalidTx: with the reason it is refused; nothing changes.
        """
        tid = self.mempool.add(tx, peer)
        if self.driver is not None:
            self.driver.tx_added()  # a quiet height starts round 0 now rather than at its next look
        return tid

    @property
    def rejected(self) -> OrderedDict[bytes, str]:
        """Recently refused, dropped or evicted transaction ids with their reasons (bounded, oldest forgotten)."""
        return self.mempool.rejected

    def next_nonce(self, account: bytes) -> int:
        """The nonce for ``account``'s next nonce-carrying transaction: ledger nonce plus those queued here."""
        return self.mempool.next_nonce(account)

    def candidates(self) -> list[Tx]:
        """Mempool transactions in the order a block should try them (they apply in this order on the head)."""
        return self.mempool.candidates()

    def drop_rejected(self, rejected: Iterable[tuple[Tx, str]]) -> None:
        """Forget transactions a block builder found not to apply, with their reasons."""
        self.mempool.drop(rejected)

    def _prune_mempool(self, included: Iterable[bytes] = ()) -> None:
        """After a block (on every node, not only the proposer: a node must learn that its own transaction was
        refused, or its next nonce would be wrong): forget the ``included`` ids and re-apply the queued ones on the
        new head, without checking their signatures again."""
        self.mempool.reset(self.state, included)

    async def submit(self, tx: Tx) -> bytes:
        """Queue ``tx`` locally and broadcast it (gossip, and directly to validators we are connected to). An
        account transaction (a wallet's) is written to the outbox file first, so that a crash does not lose what
        the node accepted; every local transaction is then re-sent while it stays pending (:meth:`resend_loop`).

        Raises:
            InvalidTx: refused by the mempool (nothing is sent).
        """
        tid = self.add_tx(tx)
        self._resend.add(tid, time.monotonic() + RESEND_FIRST)
        if priority(tx) is Priority.ACCOUNT:
            self._outbox.save(self.mempool.local())
        await self._send_out(tx, direct=not self.is_validator)
        return tid

    async def _send_out(self, tx: Tx, direct: bool) -> None:
        """Gossip ``tx``; with ``direct``, also hand it to each connected validator (but us) over the submit
        protocol (5 s each), which needs no gossip mesh."""
        await self.net.publish(self.net.topic("tx"), pack(tx.to_wire()))
        if not direct:
            return
        for v in self.state.valset().accounts:
            peer = account_to_str(v)
            if v != self.ident.account and peer in self.net.connected_peers():
                try:
                    await self.net.request(peer, SUBMIT_PROTOCOL, {"tx": tx.to_wire()}, timeout=5)
                except Exception as e:  # noqa: BLE001 - gossip still carries it
                    log.debug("direct submit to %s failed: %s", peer[:16], e)

    # ---------------------------------------------------------------- pending transactions: status, re-send, outbox

    def tx_status(self, tid: bytes) -> TxStatus:
        """Where transaction ``tid`` stands on this node: in a stored block (its height), queued (for how long,
        why: waiting for a block, or for a missing nonce), dropped or refused (why), or unknown."""
        loc = self.store.tx_location(tid)
        if loc is not None:
            return TxStatus(TxState.INCLUDED, height=loc[0])
        st = self.mempool.status(tid)
        if st is None:
            return TxStatus(TxState.UNKNOWN)
        return dataclasses.replace(st, resent=self._resend.count(tid))

    def resend_due(self, now: float) -> list[Tx]:
        """The local pending transactions to re-send at ``now`` (``time.monotonic`` seconds), oldest first
        (:class:`~node.ledger.outbox.ResendSchedule`: 2 s after submission, then waits doubling to 60 s; all at
        once after a catch-up by sync or a newly connected validator; at most 32). Forgets those no longer queued
        (logging the reason of a dropped one) and rewrites the outbox when it changed."""
        peers = frozenset(p for p in (account_to_str(v) for v in self.state.valset().accounts)
                          if self.host is not None and p in self.host.connected_peers())
        fresh, self._known_peers = bool(peers - self._known_peers), peers
        caught_up, self._caught_up = self._caught_up, False
        local = self.mempool.local()
        queued = {tx.id for tx in local}
        for tid, count in self._resend.forget_except(queued):
            st = self.tx_status(tid)
            if st.state is TxState.DROPPED:
                log.info("local transaction %s dropped after %d re-sends: %s", tid.hex()[:16], count, st.reason)
        if self._outbox.ids - queued:
            self._outbox.save(local)
        out = self._resend.due(local, now, fresh or caught_up)
        for tx in out:
            n = self._resend.count(tx.id)
            if n in (3, 6) or n % 10 == 0:
                log.info("local transaction %s still %s; re-sent %d times", tx.id.hex()[:16],
                         self.tx_status(tx.id).describe(), n)
        return out

    async def resend_loop(self) -> None:
        """Every :data:`RESEND_LOOK` seconds, re-send the local transactions that are due (:meth:`resend_due`) by
        gossip and directly to every connected validator: one published while this node had no gossip mesh (just
        started or reconnected), or lost with a peer, still reaches a block, or is dropped with a reason."""
        while True:
            await trio.sleep(RESEND_LOOK)
            for tx in self.resend_due(time.monotonic()):
                with trio.move_on_after(10):
                    try:
                        await self._send_out(tx, direct=True)
                    except Exception as e:  # noqa: BLE001  (whatever failed is retried at its next turn; the loop must live)
                        log.debug("re-send of %s failed: %s", tx.id.hex()[:16], e)

    def load_outbox(self) -> int:
        """Queue again the local transactions the outbox file kept (after a restart or a crash): each one is
        queued and re-sent, or refused with its reason (``tx_status`` then says dropped, and why). Returns how
        many were queued again."""
        txs = self._outbox.load()
        n = 0
        for tx in txs:
            try:
                self.add_tx(tx)
            except InvalidTx as e:
                log.info("outbox transaction %s not queued again: %s", tx.id.hex()[:16], e)
                continue
            self._resend.add(tx.id, time.monotonic())
            n += 1
        if txs:
            log.info("outbox: %d of %d local transactions queued again", n, len(txs))
        self._outbox.save(self.mempool.local())
        return n

    def _admit_wire(self, decode: Callable[[], Tx], peer: str) -> bytes:
        """Admit the transaction ``decode()`` builds, from ``peer``; a refused one (undecodable included) counts
        against the peer and is logged at debug level with its reason and the peer. A peer over its refusal
        budget (:meth:`Mempool.check_peer`) is refused without decoding. (It is not penalised towards a
        disconnect: measured in ``tests/e2e/test_flood.py``, the redials and failed handshakes that follow a ban
        cost the node more than refusing the flood unread.)

        Raises:
            InvalidTx: with the reason.
        """
        tx = None
        try:
            self.mempool.check_peer(peer)
            tx = decode()
            return self.add_tx(tx, peer)
        except (DecodeError, InvalidTx) as e:
            if tx is None:  # add_tx records its own refusals
                self.mempool.note_refusal(peer, None, str(e))
            log.debug("refused %s from %s: %s", f"tx {tx.id.hex()[:16]}" if tx is not None else "a transaction",
                      peer, e)
            raise InvalidTx(str(e)) from None

    def _validate_tx_gossip(self, data: bytes, from_peer: str) -> bool:
        """The tx topic's gossip validator: admit the transaction; only an admitted one is delivered and relayed
        to other peers (a refused one stops here: a flood is not amplified by honest nodes). A transaction
        already queued or in a recent block is a no-op admission (True); pubsub's seen-cache drops repeats."""
        try:
            self._admit_wire(lambda: decode_tx(unpack(data, max_size=MAX_TX_WIRE)), from_peer)
            return True
        except InvalidTx:
            return False  # logged with its reason; gossip has no one to answer

    async def _on_tx_gossip(self, data: bytes, from_peer: str) -> None:
        """Admitted already, by :meth:`_validate_tx_gossip`."""

    async def _submit_handler(self, stream: MsgStream, peer: str) -> None:
        """``SUBMIT_PROTOCOL``: ``{"tx": wire}`` → ``{"status": "ok", "id": 32 B}`` or ``invalid_tx``; the reply
        is written within :data:`REPLY_TIMEOUT` seconds (a peer that does not read it is cut)."""
        msg = await read_msg(stream, timeout=10, max_message=MAX_TX_WIRE)
        try:
            tid = self._admit_wire(lambda: decode_tx(msg.get("tx")), peer)
            reply = {"status": "ok", "id": tid}
        except InvalidTx as e:
            reply = error_reply("invalid_tx", str(e))
        await write_msg(stream, reply, timeout=REPLY_TIMEOUT)

    # ---------------------------------------------------------------- blocks

    async def _commit(self, block: Block, commit: Sequence[Sequence[Any]], new_state: State) -> None:
        old = self.state
        self.store.append(block, commit, old, new_state)
        self.parent_state, self.state = self.store.parent_state, new_state
        self._prune_mempool([t.id for t in block.txs])
        for fn in self._listeners:
            try:
                fn(block, new_state)
            except Exception:  # a listener must never stop the chain
                log.exception("block listener failed")
        ev, self.new_block = self.new_block, trio.Event()
        ev.set()

    async def commit_decided(self, block: Block, commit: Sequence[Sequence[Any]], new_state: State) -> bool:
        """Store a block this node's consensus decided. False if sync already stored that height."""
        async with self._lock:
            if self.state.height != block.height - 1:
                return False
            await self._commit(block, commit, new_state)
            return True

    def request_sync(self, peer: str) -> None:
        """Ask the sync task to catch up from ``peer`` soon (non-blocking)."""
        with contextlib.suppress(trio.WouldBlock):
            self._sync_requests.send_nowait(peer)

    async def apply_remote(self, wire: dict[str, Any]) -> bool:
        """Check and store a block with its commit from a peer. Returns True if it extended our chain.

        Raises:
            InvalidBlock: the block does not verify on top of our head.
        """
        block = decode_block(wire.get("b"))
        commit = wire.get("c")
        if not isinstance(commit, list):
            raise InvalidBlock("missing commit")
        async with self._lock:
            if block.height != self.state.height + 1:
                return False
            new_state = check_and_apply(self.state, block, commit, self.mempool.verified)
            await self._commit(block, commit, new_state)
            return True

    async def _on_consensus_gossip(self, data: bytes, from_peer: str) -> None:
        if self.drop is not None and self.drop(from_peer):
            return
        try:
            wire = unpack(data)
            if not isinstance(wire, dict):
                raise DecodeError("consensus message is not a map")
            if wire.get("k") != "block":
                if self.driver is not None:
                    self.driver.inbound(wire, from_peer)
                return
            height = wire["b"]["h"][1]
            if height > self.state.height + 1:
                self.request_sync(from_peer)
            else:
                await self.apply_remote(wire)
        except (DecodeError, InvalidBlock, KeyError, TypeError, IndexError) as e:
            log.warning("bad block from %s: %s", from_peer, e)

    async def _sync_handler(self, stream: MsgStream, peer: str) -> None:
        """``SYNC_PROTOCOL``: ``{"from": height}`` → ``{"status": "ok", "head": int, "blocks": [wire, ...]}``: the
        blocks from that height on, at most :data:`SYNC_BATCH` of them and :data:`SYNC_REPLY_BYTES` bytes (at least
        one); or ``bad_request``, ``pruned``, ``busy``.

        Memory: each block's packed size is reserved 3x (it, the packed reply, its frames) from
        :attr:`reply_budget` right after it is read, before the loop yields: the first with a wait (then read
        again), the next ones without (the reply stops at the first that does not fit). The reply is written
        within 10 s + 1 s per MiB (:func:`node.p2p.filesend.reply_deadline`); errors within
        :data:`REPLY_TIMEOUT`."""
        msg = await read_msg(stream, timeout=10, max_message=1 << 12)
        start = msg.get("from")
        if not isinstance(start, int) or isinstance(start, bool) or start < 1:
            await write_msg(stream, error_reply("bad_request", "from must be a height >= 1"), timeout=REPLY_TIMEOUT)
            return
        low = self.store.pruned_below
        if start < low <= self.store.head:
            await write_msg(stream, error_reply(
                "pruned", f"block bodies below height {low} are not held by this node (pruned, or state-synced); "
                          f"the lowest block it has is {low}: ask a node that keeps every block, or state-sync"),
                timeout=REPLY_TIMEOUT)
            return
        end = min(self.store.head, start + SYNC_BATCH - 1)
        budget = self.reply_budget
        first = self.store.get_block_raw(start) if start <= end else None
        first_size = len(pack(first)) if first is not None else 0
        del first  # not held while the reservation waits
        held: list[Reservation] = []
        try:
            try:
                async with budget.reserve(peer, 3 * first_size) as r0:
                    blocks, size = [], 0
                    for h in range(start, end + 1):
                        wire = self.store.get_block_raw(h)
                        if wire is None:
                            break
                        n = len(pack(wire))
                        if h > start:
                            if size + n > SYNC_REPLY_BYTES:
                                break
                            try:
                                held.append(budget.try_reserve(peer, 3 * n))
                            except Busy:
                                break
                        elif n > r0.nbytes // 3:  # grew since it was sized (cannot happen to a stored block)
                            break
                        blocks.append(wire)
                        size += n
                    reply = {"status": "ok", "head": self.store.head, "blocks": blocks}
                    del blocks
                    await write_msg(stream, reply, timeout=reply_deadline(size))
            except Busy as e:
                await write_msg(stream, error_reply(e.code, e.message), timeout=REPLY_TIMEOUT)
        finally:
            for r in held:
                budget.release(r)

    async def sync_from(self, peer: str) -> int:
        """Fetch and apply blocks from ``peer`` until we reach its head. Returns blocks applied."""
        applied = 0
        while True:
            reply = await self.net.request(peer, SYNC_PROTOCOL, {"from": self.state.height + 1}, timeout=20,
                                            max_message=MAX_MESSAGE)
            blocks = reply.get("blocks") or []
            for wire in blocks:
                if not await self.apply_remote(wire):
                    break
                applied += 1
                self._caught_up = True  # local pending transactions are re-sent at once (resend_due)
            if not blocks or self.state.height >= reply.get("head", 0):
                return applied

    async def sync_loop(self) -> None:
        """Pull missing blocks: from a peer that showed us a later height at once, and from every connected
        validator after a period in which no block arrived (gossip may miss blocks; a restarted node starts
        behind): 4 block times, at least 1 s, at start and while polls bring blocks; once a poll brought none, on
        a quiet chain the heartbeat (at most ``SYNC_POLL_MAX`` s). While gossip delivers blocks nobody is polled:
        an idle follower polling its validator every second was about a third of the validator's idle CPU
        (bench/idle.py)."""
        p = self.genesis.params
        base = max(1.0, 4 * p.block_time_ms / 1000)
        quiet = max(base, min(p.heartbeat() / 1000, SYNC_POLL_MAX))
        period = base
        while True:
            targets: list[str] = []
            height = self.state.height
            with trio.move_on_after(period):
                targets.append(await self._sync_requests_recv.receive())
            if not targets and self.state.height > height:
                continue  # blocks arrived by gossip meanwhile: nothing to pull
            vals = dict.fromkeys(self.genesis.validators + self.state.valset().accounts)
            targets += [account_to_str(v) for v in vals if v != self.ident.account]
            asked = False
            for peer in dict.fromkeys(targets):
                if peer not in self.net.connected_peers() or (self.drop is not None and self.drop(peer)):
                    continue
                asked = True
                try:
                    await self.sync_from(peer)
                except Exception as e:  # noqa: BLE001 - a peer's bad data must never kill the sync loop
                    log.info("sync from %s failed: %s", peer[:16], e)
            period = quiet if asked and self.state.height == height else base  # behind or alone: ask again soon

    async def run(self) -> None:
        """Subscribe, serve sync and submit requests, run consensus (validators) and sync. Runs forever."""
        self.net.set_handler(SYNC_PROTOCOL, self._sync_handler)
        self.net.set_handler(SUBMIT_PROTOCOL, self._submit_handler)
        await self.net.subscribe(self.net.topic("tx"), self._on_tx_gossip, self._validate_tx_gossip)
        await self.net.subscribe(self.net.topic("consensus"), self._on_consensus_gossip)
        self.load_outbox()
        async with trio.open_nursery() as n:
            n.start_soon(self.sync_loop)
            n.start_soon(self.resend_loop)
            if self.driver is not None:
                n.start_soon(self.driver.run)

    async def wait_for_height(self, height: int, timeout: float) -> None:
        with trio.fail_after(timeout):
            while self.state.height < height:
                await self.new_block.wait()

