"""The batch worker: a service every bonded node runs (:class:`BatchWorker`). The libp2p protocol that serves item
files and result bytes by content hash, and who may fetch them, is :mod:`node.batch.content`.

At each block the worker asks the ledger for its undecided assignments
(:func:`node.ledger.core.batch.assignments_of`). For an assignment it has no result for yet, it fetches the batch's
item file from the requester (checked against the post's ``items_root``), runs the item on the node's torch
executor (:mod:`node.batch.tasks`), stores the result bytes (served to the requester later, by hash), draws a
32-byte salt and **persists the salt with the result hash before sending the commit** (one JSON file per
(batch, item, attempt) under ``<data dir>/batch/commits``, temp file + fsync + rename): a worker that restarts
between its commit and its reveal still opens its commitment, and one that crashed before the file existed never
sent a commit it could not open. Once the commit is on the ledger and the item's reveal phase is open (every drawn
worker committed, or the commit window passed) it sends the reveal. A commit or reveal that has not reached the
ledger after :data:`RESEND_BLOCKS` blocks is sent again (the ledger counts each once per slot). At most
:data:`MAX_OUTSTANDING` commits and reveals are out (sent, not on the ledger yet) at a time, earliest deadline
first, and :data:`SUBMITS` of them in a submit at once: a worker with hundreds of results ready paces itself by
the blocks instead of flooding its validator (see :meth:`BatchWorker._send`). The file of a decided item is
removed.

A node drawn for an item's audit committee (:mod:`node.ledger.core.batchaudit`) runs the item the same way, keeps
the result bytes (the requester may fetch them from it if the audit overturns the accepted result) and sends a
:class:`~node.ledger.core.batchtx.BatchAuditVote` of their hash, paced with the commits and reveals.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

import trio

from ..duty.parts import NodeParts
from ..duty.runner import DutyRunner
from ..duty.seams import Executor, Ledger
from ..encoding import pack
from ..identity import Identity
from ..ledger.core.batch import assignments_of
from ..ledger.core.batchaudit import audits_of
from ..ledger.core.batchstate import AuditStatus, Batch, Item, ItemStatus, item_key, open_batches
from ..ledger.core.batchtx import BatchAuditVote, BatchCommit, BatchReveal, commitment
from ..ledger.core.state import State
from ..ledger.core.tx import InvalidTx
from .content import (
    Requester,
    Unavailable,
    fetch_content,
    items_check,
)
from .items import ContentStore, ItemFile, parse_posted
from .tasks import BATCH_FAULTS, ItemRunner

log = logging.getLogger("tally.batch")

RESEND_BLOCKS = 5  # a commit or reveal not on the ledger after this many blocks is sent again
PARALLEL = 2  # items fetched/run at once (the executor runs one torch call at a time anyway)
SUBMITS = 4  # commits and reveals being submitted at once (each opens a stream to every connected validator)
MAX_OUTSTANDING = 32  # commits and reveals sent and not yet on the ledger (nor due for a resend), at most


class Runner(Protocol):
    """:class:`node.batch.tasks.ItemRunner`."""

    def run(self, kind: str, item: dict[str, Any], max_tokens: int) -> bytes: ...


Slot = tuple[bytes, int, int]  # (batch id, item, attempt); attempt AUDIT: this node's audit of the decided item
AUDIT = -1
SlotTx = BatchCommit | BatchReveal | BatchAuditVote  # what the worker sends for a slot


class SaltBook:
    """Salts and result hashes of this worker's commitments, one JSON file each under ``directory`` (atomic writes;
    read back at start)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.entries: dict[Slot, tuple[bytes, bytes]] = {}
        for p in self.dir.glob("*.json"):
            try:
                bid, i, a = p.stem.split("-")
                rec = json.loads(p.read_text())
                self.entries[(bytes.fromhex(bid), int(i), int(a))] = (bytes.fromhex(rec["result"]),
                                                                      bytes.fromhex(rec["salt"]))
            except (ValueError, KeyError, OSError) as e:
                log.warning("ignoring unreadable batch commitment file %s: %s", p.name, e)

    def _path(self, slot: Slot) -> Path:
        return self.dir / f"{slot[0].hex()}-{slot[1]}-{slot[2]}.json"

    def add(self, slot: Slot, result: bytes, salt: bytes) -> None:
        """Persist (temp file, fsync, rename, fsync of the directory), then remember."""
        path = self._path(slot)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"result": result.hex(), "salt": salt.hex()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.entries[slot] = (result, salt)

    def drop(self, slot: Slot) -> None:
        self.entries.pop(slot, None)
        self._path(slot).unlink(missing_ok=True)


class BatchWorker:
    """Does this node's batch assignments: run, commit, reveal (module docstring).

    Args:
        ident: the worker's key. ledger, host, executor: the node's services. store: item files and results.
        runner: executes one item (on the executor thread). data_dir: where :class:`SaltBook` keeps salts.
    """

    def __init__(self, ident: Identity, ledger: Ledger, host: Requester, store: ContentStore,
                 executor: Executor, runner: Runner, data_dir: Path):
        self.ident, self.ledger, self.host, self.store = ident, ledger, host, store
        self.executor, self.runner = executor, runner
        self.book = SaltBook(Path(data_dir) / "batch" / "commits")
        self.files: dict[bytes, ItemFile | None] = {}  # batch id -> parsed item file (None: unparsable)
        self._parsing: dict[bytes, trio.Event] = {}  # batch id -> set when its file's fetch and parse end
        self.working: set[Slot] = set()
        self.audits: dict[tuple[bytes, int], bytes] = {}  # (batch id, item) -> result hash, for open audits
        self.sent: dict[tuple[str, Slot], int] = {}  # ("commit" | "reveal", slot) -> height sent at
        self.retry_at: dict[bytes, float] = {}  # batch id -> trio time before which its file is not fetched again
        self.done = 0  # results computed here (for the API and tests)
        self._limit = trio.CapacityLimiter(PARALLEL)
        self._submits = trio.CapacityLimiter(SUBMITS)
        self._inflight: set[tuple[str, Slot]] = set()  # commits and reveals queued for or in a submit
        self.duty_runner = DutyRunner(self, ledger)  # steps at each block, and when a result is ready

    @classmethod
    def from_parts(cls, parts: NodeParts, store: ContentStore) -> BatchWorker:
        """The node's batch worker (:class:`node.duty.parts.NodeParts`), items run on ``config.model_dir``
        (:class:`node.batch.tasks.ItemRunner`; a ``config.fault`` of :data:`node.batch.tasks.BATCH_FAULTS` makes
        it cheat), item files and results in ``store``. Idle unless the ledger assigns this (bonded) node items."""
        cfg = parts.config
        runner = ItemRunner(cfg.model_dir, cfg.fault if cfg.fault in BATCH_FAULTS else None)
        return cls(parts.ident, parts.ledger, parts.host, store, parts.executor, runner, cfg.data_dir)

    @property
    def name(self) -> str:
        """The duty's name in logs (:class:`node.duty.runner.Duty`)."""
        return "batch worker"

    async def run(self) -> None:
        """Forever: at each block, work on this node's assignments (:class:`node.duty.runner.DutyRunner`)."""
        await self.duty_runner.run()

    def _prune(self, st: State) -> None:
        for slot in list(self.book.entries):
            bid, i, a = slot
            it: Item | None = st.tables["batch_items"].get(item_key(bid, i))
            if it is not None and (it.status != ItemStatus.ASSIGNED or it.attempt > a):
                self.book.drop(slot)
                self.sent.pop(("commit", slot), None)
                self.sent.pop(("reveal", slot), None)
        for bid, i in list(self.audits):
            it = st.tables["batch_items"].get(item_key(bid, i))
            if it is None or it.audit != AuditStatus.OPEN:
                del self.audits[(bid, i)]
                self.sent.pop(("audit", (bid, i, AUDIT)), None)
        busy = {slot[0] for slot in self.working} | {bid for bid, _ in self.audits}
        for bid in [bid for bid in self.files if bid not in open_batches(st) and bid not in busy]:
            del self.files[bid]  # closed: its items are decided (an audit drawn later fetches it again)

    async def step(self, nursery: trio.Nursery) -> None:
        """One look at the state (:class:`node.duty.runner.Duty`): start running the items assigned to this node
        that have no result yet, and send the commits, reveals and audit votes that are due (paced: see
        :meth:`_send`)."""
        st = self.ledger.state
        me = self.ident.account
        self._prune(st)
        nxt = st.height + 1  # the height a transaction sent now lands in, at the earliest
        ready: list[tuple[int, int, SlotTx, tuple[str, Slot]]] = []  # (deadline height, n, tx, key)
        outstanding = len(self._inflight)  # sent, not on the ledger yet, not due for a resend
        for slot in assignments_of(st, me):
            bid, i, a = slot
            b: Batch = st.tables["batches"][bid]
            it: Item = st.tables["batch_items"][item_key(bid, i)]
            cw_end = it.assigned_height + b.post.commit_window
            rec = self.book.entries.get(slot)
            if rec is None:
                if nxt <= cw_end and slot not in self.working:
                    self.working.add(slot)
                    nursery.start_soon(self._work, slot)
                continue
            result, salt = rec
            if it.commitment_of(me) is None:
                key = ("commit", slot)
                if nxt <= cw_end and self._due(key, st.height):
                    c = commitment(bid, i, a, me, result, salt)
                    ready.append((cw_end, len(ready), BatchCommit(self.ledger.chain_id, me, bid, i, a, c), key))
                elif self._recent(key, st.height):
                    outstanding += 1
            elif all(w != me for w, _ in it.reveals):
                key = ("reveal", slot)
                if ((nxt > cw_end or len(it.commits) == len(it.workers)) and nxt <= it.due
                        and self._due(key, st.height)):
                    ready.append((it.due, len(ready), BatchReveal(self.ledger.chain_id, me, bid, i, a, result, salt),
                                  key))
                elif self._recent(key, st.height):
                    outstanding += 1
        for bid, i in audits_of(st, me):
            slot = (bid, i, AUDIT)
            it = st.tables["batch_items"][item_key(bid, i)]
            found = self.audits.get((bid, i))
            if found is None:
                if slot not in self.working:
                    self.working.add(slot)
                    nursery.start_soon(self._work, slot)
                continue
            key = ("audit", slot)
            if nxt <= it.audit_due and self._due(key, st.height):
                ready.append((it.audit_due, len(ready), BatchAuditVote(self.ledger.chain_id, me, bid, i, found), key))
            elif self._recent(key, st.height):
                outstanding += 1
        # earliest deadline first (a commit's is its commit window's end, a reveal's its item's due height, an
        # audit vote's its audit's due height)
        ready.sort(key=lambda r: r[:2])
        for _deadline, _n, tx, key in ready[:max(0, MAX_OUTSTANDING - outstanding)]:
            self._send(nursery, tx, key, st)

    def _recent(self, key: tuple[str, Slot], height: int) -> bool:
        """Sent (the submit over) less than :data:`RESEND_BLOCKS` blocks ago: it may still land."""
        sent = self.sent.get(key)
        return key not in self._inflight and sent is not None and height - sent < RESEND_BLOCKS

    def _due(self, key: tuple[str, Slot], height: int) -> bool:
        if key in self._inflight:
            return False
        sent = self.sent.get(key)
        return sent is None or height - sent >= RESEND_BLOCKS

    def _send(self, nursery: trio.Nursery, tx: SlotTx, key: tuple[str, Slot], st: State) -> None:
        """Submit in the background: a submit waits on gossip and on direct sends to validators, and one slow
        validator must not hold back this worker's other commits and reveals. At most :data:`SUBMITS` run at
        once, and :meth:`step` keeps at most :data:`MAX_OUTSTANDING` out: seen without either, five workers with
        ~120 results each sent them all at once, hit the mempool's per-account cap, and the validator's gossip
        queues to them overflowed and dropped blocks, leaving them minutes behind and syncing. The resend clock
        starts when the submit ends."""
        self.sent[key] = st.height
        self._inflight.add(key)
        nursery.start_soon(self._submit, tx, key)

    async def _submit(self, tx: SlotTx, key: tuple[str, Slot]) -> None:
        try:
            async with self._submits:
                await self.ledger.submit(tx.signed(self.ident))
        except InvalidTx as e:
            log.info("%s of batch %s item %d refused by the local node (sent again in %d blocks): %s", tx.KIND,
                     tx.batch_id.hex()[:12], tx.item, RESEND_BLOCKS, e)
        except Exception as e:  # noqa: BLE001 - gossip or a validator failing: the resend after RESEND_BLOCKS retries
            log.info("%s of batch %s item %d not sent: %s: %s", tx.KIND, tx.batch_id.hex()[:12], tx.item,
                     type(e).__name__, e)
        finally:
            self._inflight.discard(key)
            if key[1] in self.book.entries or key[1][:2] in self.audits:  # not pruned meanwhile (decided)
                self.sent[key] = self.ledger.state.height

    async def _item_file(self, b: Batch) -> ItemFile | None:
        """The batch's parsed item file, or ``None`` when it cannot be worked (every item then gets the
        ``bad_item_file`` result). Fetched once and parsed once per batch, on a worker thread
        (:func:`node.batch.items.parse_posted`, which never raises): concurrent callers for the same batch wait
        for the first, and the answer (``None`` included) is cached until the batch closes (:meth:`_prune`).

        Raises:
            Unavailable: the file could not be fetched (nothing is cached; the caller retries later).
        """
        bid = b.post.batch_id
        while bid in self._parsing:  # another item of this batch is fetching/parsing it: wait for its answer
            await self._parsing[bid].wait()
        if bid in self.files:
            return self.files[bid]
        done = self._parsing[bid] = trio.Event()
        try:
            p = b.post
            data = await fetch_content(self.host, self.store, p.items_root, [p.sender], items_check(p.items_root))
            f, why = await trio.to_thread.run_sync(parse_posted, data, p.kind, p.n_items)
            if f is None:  # the file is fixed by its hash: every honest worker reaches the same answer
                log.warning("batch %s: its item file is malformed (%s); every item gets the error result",
                            bid.hex()[:12], why)
            self.files[bid] = f
            return f
        finally:
            del self._parsing[bid]
            done.set()

    async def _work(self, slot: Slot) -> None:
        bid, i, a = slot
        try:
            async with self._limit:
                if trio.current_time() < self.retry_at.get(bid, 0.0):
                    return
                b: Batch = self.ledger.state.tables["batches"][bid]
                try:
                    f = await self._item_file(b)
                except Unavailable as e:
                    self.retry_at[bid] = trio.current_time() + 2.0
                    log.info("batch %s: item file not fetched yet (%s); retrying", bid.hex()[:12], e)
                    return
                if f is None:
                    data = pack({"error": "bad_item_file"})
                else:
                    data = await self.executor.run(self.runner.run, b.post.kind, f.items[i], b.post.max_tokens)
                key = self.store.put_result(data)
                if a == AUDIT:
                    self.audits[(bid, i)] = key
                else:
                    self.book.add(slot, key, os.urandom(32))  # before the commit is ever sent
                self.done += 1
                self.duty_runner.wake()  # commit now rather than at the next block
        except Exception:
            log.exception("batch %s item %d failed here; retried at the next block", bid.hex()[:12], i)
        finally:
            self.working.discard(slot)
