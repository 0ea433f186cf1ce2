"""A node's part in collaborative training runs: train the rounds of runs it joined, reveal, aggregate when drawn.

Runs on the node's event loop; torch work goes through the node's executor (:mod:`node.compute.executor`).
Every block it looks at the open runs (:mod:`node.ledger.core.runs`) in which this node is a participant of the open
round and does what the phase asks:

* **COMMIT** — fetch θ_r by content hash (from the last aggregator, the last round's workers or the sponsor) and
  check it: for r > 0 re-compute the last outer step from the accepted Δs and refuse to train on a θ whose id
  differs (:func:`node.training.rounds.recompute_outer`). Train the H batches the beacon assigned, encode Δ and
  submit a :class:`~node.ledger.core.runtx.RoundReceipt`. The committed tensors (θ_worker, inner states, Δ) are
  **sealed**: kept in memory, not in the blob store that peers can read, so nobody can copy them in time.
* **REVEAL** (or the attempt failed and its receipts are being replayed) — unseal into the blob store and submit
  a :class:`~node.ledger.core.runtx.RoundReveal`.
* **AGGREGATE**, when the beacon drew this node — fetch every revealed Δ, screen and aggregate it
  (:func:`node.training.rounds.aggregate_round`), store θ_{r+1} and the momentum, submit a
  :class:`~node.ledger.core.runtx.RoundAggregate`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ..blobs import BlobStore, BlobUnavailable, fetch_blob
from ..compute.data import dataset_bytes
from ..compute.executor import load_torch
from ..duty.parts import NodeParts
from ..duty.runner import DutyRunner
from ..duty.seams import Executor, Host, Ledger
from ..encoding import commitments_root
from ..identity import Identity
from ..ledger.core.runs import Phase, attempt_of
from ..ledger.core.runstate import Run, open_runs, runs_of
from ..ledger.core.runtx import NO_MOMENTUM, RoundAggregate, RoundReceipt, RoundReveal, RunPost
from ..ledger.core.state import State
from ..ledger.core.status import INVALID_S, SAMPLED
from ..ledger.core.tx import InvalidTx
from .faults import RUN_FAULTS

if TYPE_CHECKING:
    import torch

    from .inner import InnerTrainer
    from .outer import OuterResult

log = logging.getLogger("tally.training")

FETCH_TIMEOUT = 8.0  # seconds per holder for a blob (then the next holder is tried)
DEV_CHAINS = ("tally-devnet", "tally-test")


@dataclass
class _Sealed:
    """What a worker committed to and serves only after the commit phase (tensor lists), and the id of the round
    receipt that commits to it (served only if that receipt is on the ledger)."""

    opt_before: list[torch.Tensor]
    params_after: list[torch.Tensor]
    opt_after: list[torch.Tensor]
    payload: list[torch.Tensor]
    receipt: bytes = b""


class RoundClosed(ValueError):
    """The round's commit phase closed (its quorum or its timeout) before this worker's work was ready."""


@dataclass
class RunCache:
    """Per-run torch objects of one node: the trainer (one run's model in memory at a time) and windows."""

    run_id: bytes = b""
    trainer: InnerTrainer | None = None
    windows: torch.Tensor | None = None  # int64 (n, seq_len + 1)
    verified: set[bytes] = field(default_factory=set)  # ids of θ this node re-computed and found right
    held: torch.Tensor | None = None  # the held-out windows a round's θ is measured on (node.training.heldout)


@dataclass(frozen=True)
class LoadedRun:
    """A :class:`RunCache` that :func:`load_run` filled: its trainer, its windows and its ``verified`` set (the
    same set object, so additions land in the cache)."""

    trainer: InnerTrainer
    windows: torch.Tensor
    verified: set[bytes]
    held: torch.Tensor | None = None


def theta_holders(state: State, run: Run) -> list[bytes]:
    """Who holds θ_r and the momentum, most likely first: for θ_0 the sponsor; later the last aggregator and the
    committee that re-computed its aggregate (both store it), then the last round's accepted workers (who
    fetched it to check it), then the sponsor."""
    out: list[bytes] = []
    if run.history:
        h = run.history[-1]
        rec = state.receipts.get(h.aggregate)
        out += [h.aggregator, *(rec.committee if rec is not None else ()), *h.accepted]
    out.append(run.post.sender)
    return list(dict.fromkeys(out))  # each account once, at its first place


async def load_run(cache: RunCache, executor: Executor, host: Host, blobs: BlobStore, model_dir: Path,
                   run: Run) -> LoadedRun:
    """The run's trainer and windows (dataset fetched by hash from the sponsor or the workers), kept in ``cache``."""
    if cache.run_id == run.post.run_id and cache.trainer is not None and cache.windows is not None:
        return LoadedRun(cache.trainer, cache.windows, cache.verified, cache.held)
    from . import rounds as rd  # local: it imports torch (~2 s); only a node in a run (or checking one) needs it
    from .heldout import run_data  # local: as rounds (torch)

    post = run.post
    text = dataset_bytes(await fetch_blob(host, blobs, post.dataset_root, [post.sender, *run.workers],
                                          timeout=FETCH_TIMEOUT))
    trainer = await executor.run(rd.make_trainer, model_dir, post)
    windows, held = await executor.run(run_data, model_dir, post, text)
    cache.run_id, cache.trainer, cache.windows, cache.verified, cache.held = post.run_id, trainer, windows, set(), held
    return LoadedRun(trainer, windows, cache.verified, held)


async def check_theta(cache: LoadedRun, executor: Executor, host: Host, blobs: BlobStore, state: State,
                      run: Run) -> list[torch.Tensor]:
    """θ_r of ``run`` fetched by its id and, for r > 0, re-computed from the last round's accepted Δs.

    Raises:
        BlobUnavailable: θ_r or an accepted Δ could not be fetched.
        ValueError: the re-computed θ_r or momentum differs from the ledger's (a wrong aggregate).
    """
    theta = await fetch_blob(host, blobs, run.params, theta_holders(state, run), timeout=FETCH_TIMEOUT)
    if not run.history or run.params in cache.verified:
        return theta
    h = run.history[-1]
    # θ_{r-1} and its momentum: held by the last round's workers (they trained from it) and its own holders
    earlier = list(h.accepted) + theta_holders(state, replace(run, history=run.history[:-1]))
    before_mom = run.history[-2].momentum_next if len(run.history) > 1 else NO_MOMENTUM
    _, params_id, mom_id = await recompute_aggregate(cache, executor, host, blobs, state, run.post, h.commits,
                                                     h.accepted, h.aggregator, h.params_before, before_mom, earlier)
    if params_id != run.params or mom_id != h.momentum_next:
        raise ValueError(f"θ of round {h.round + 1} re-computed from the accepted Δs differs from the ledger's")
    cache.verified.add(run.params)
    log.info("run %s round %d: θ %s fetched by hash and re-computed from round %d's %d accepted Δs: matches the "
             "ledger", run.post.run_id.hex()[:12], run.round, run.params.hex(), h.round, len(h.accepted))
    return theta


async def recompute_aggregate(cache: LoadedRun, executor: Executor, host: Host, blobs: BlobStore, state: State,
                              post: RunPost, commits: Iterable[tuple[bytes, bytes, bytes]], accepted: Iterable[bytes],
                              aggregator: bytes, params_before: bytes, momentum_before: bytes,
                              holders: list[bytes]) -> tuple[OuterResult, bytes, bytes]:
    """Fetch θ_r, the outer momentum (none for ``NO_MOMENTUM``) and the ``accepted`` workers' Δs by content hash and
    re-compute the outer step (:func:`node.training.rounds.recompute_outer`). Returns ``(OuterResult, θ_{r+1} id,
    momentum id)`` — what a worker checks before training and a committee checks in an aggregate.

    Raises:
        BlobUnavailable: a tensor list nobody serves.
    """
    theta = await fetch_blob(host, blobs, params_before, holders, timeout=FETCH_TIMEOUT)
    mom = None if momentum_before == NO_MOMENTUM else await fetch_blob(host, blobs, momentum_before, holders,
                                                                       timeout=FETCH_TIMEOUT)
    from . import rounds as rd  # local: it imports torch (~2 s); only a node in a run (or checking one) needs it

    payloads = await fetch_payloads(host, blobs, state, commits, accepted, aggregator)
    res = await executor.run(rd.recompute_outer, cache.trainer, post, theta, mom, payloads)
    mom_id = NO_MOMENTUM if res.momentum is None else commitments_root(res.momentum)
    return res, commitments_root(res.params), mom_id


async def fetch_payloads(host: Host, blobs: BlobStore, state: State, commits: Iterable[tuple[bytes, bytes, bytes]],
                         workers: Iterable[bytes], aggregator: bytes) -> dict[bytes, list[torch.Tensor]]:
    """``{worker: Δ payload}`` of ``workers`` (their round receipts among ``commits``, roots from the ledger
    ``state``), from each worker or else the aggregator, who kept them.

    Raises:
        BlobUnavailable: nobody serves one of them.
    """
    rids = {w: rid for w, rid, _ in commits}
    out: dict[bytes, list[torch.Tensor]] = {}
    for w in workers:
        root = state.receipts[rids[w]].receipt.delta_root
        out[w] = await fetch_blob(host, blobs, root, [w, aggregator], timeout=FETCH_TIMEOUT)
    return out


class RunWorker:
    """Trains the runs this node joined (``node run join``), reveals its Δs, aggregates when drawn.

    Args:
        fault: a cheat of :data:`node.training.faults.RUN_FAULTS` (devnet and test chains only).

    Raises:
        ValueError: a fault on a chain that is not a devnet or test chain.
    """

    def __init__(self, ident: Identity, ledger: Ledger, host: Host, blobs: BlobStore, executor: Executor,
                 model_dir: Path, model_id: bytes, fault: str | None = None) -> None:
        if fault is not None and not ledger.chain_id.startswith(DEV_CHAINS):
            raise ValueError("cheat switches exist only on devnet and test chains")
        self.ident, self.ledger, self.host, self.blobs, self.executor = ident, ledger, host, blobs, executor
        self.model_dir, self.model_id, self.fault = model_dir, model_id, fault
        self.cache = RunCache()
        self.sealed: dict[tuple[bytes, int, int], _Sealed] = {}
        self.committed: set[tuple[bytes, int, int]] = set()
        self.revealed: set[tuple[bytes, int, int]] = set()
        self.aggregated: set[tuple[bytes, int, int, bytes]] = set()
        self.busy: set[bytes] = set()
        self.retry_at: dict[bytes, tuple[int, float]] = {}  # run -> (failures, trio time of the next try)
        self.last_payload: dict[bytes, list[torch.Tensor]] = {}  # run -> our previous Δ (the run-replay cheat)
        self.stale: dict[bytes, list[torch.Tensor]] = {}  # run -> the θ we trained from before (the run-stale cheat)
        self.log: list[str] = []  # what happened, for status and tests
        self.duty_runner = DutyRunner(self, ledger, at_start=True)  # at start (a restart may have work) and per block

    @classmethod
    def from_parts(cls, parts: NodeParts) -> RunWorker:
        """The node's run worker (:class:`node.duty.parts.NodeParts`); a ``config.fault`` of
        :data:`node.training.faults.RUN_FAULTS` makes it cheat (test and devnet chains). Idle until this node
        joins a run."""
        cfg = parts.config
        return cls(parts.ident, parts.ledger, parts.host, parts.blobs, parts.executor, cfg.model_dir, parts.model_id,
                   fault=cfg.fault if cfg.fault in RUN_FAULTS else None)

    @property
    def name(self) -> str:
        """The duty's name in logs (:class:`node.duty.runner.Duty`)."""
        return "training-run worker"

    async def run(self) -> None:
        """Forever: at start and after each block, :meth:`step` (:class:`node.duty.runner.DutyRunner`: a failed
        step is logged and retried at a later block, backing off)."""
        await self.duty_runner.run()

    async def step(self, nursery: trio.Nursery) -> None:
        """One look at the open runs (:class:`node.duty.runner.Duty`): serve and reveal what an attempt that moved
        on committed to, start training a round this node takes part in, or aggregating one it was drawn for."""
        st = self.ledger.state
        me = self.ident.account
        for rid in list(open_runs(st)):
            run = runs_of(st)[rid]
            for key in [k for k in self.sealed if k[0] == rid]:  # an attempt moved on: serve what we committed
                cur = run.cur
                if cur is None or (cur.round, cur.attempt) != key[1:] or cur.phase != Phase.COMMIT:
                    await self._reveal(run, key)
            cur = run.cur
            if cur is None or run.post.model_id != self.model_id or me not in cur.participants:
                continue
            key = (rid, cur.round, cur.attempt)
            if trio.current_time() < self.retry_at.get(rid, (0, 0.0))[1]:
                continue  # backing off after a failure (a peer that keeps failing is not hammered)
            if cur.phase == Phase.COMMIT and key not in self.committed and rid not in self.busy:
                self.busy.add(rid)
                nursery.start_soon(self._guard, rid, self._train, run)
            elif (cur.phase == Phase.AGGREGATE and cur.aggregator == me
                  and (*key, cur.aggregator) not in self.aggregated and rid not in self.busy
                  and all(st.receipts[x].status != SAMPLED for _, x, _ in cur.commits)):
                self.busy.add(rid)
                nursery.start_soon(self._guard, rid, self._aggregate, run)

    async def _guard(self, rid: bytes, fn: Callable[[Run], Awaitable[None]], run: Run) -> None:
        try:
            await fn(run)
            self.retry_at.pop(rid, None)
        except (BlobUnavailable, ValueError, InvalidTx) as e:
            if not isinstance(e, RoundClosed):  # too slow for a round: the next one is new work, tried at once
                n = self.retry_at.get(rid, (0, 0.0))[0] + 1
                self.retry_at[rid] = (n, trio.current_time() + min(30.0, 0.5 * 2 ** n))
            log.warning("run %s round %s: %s", rid.hex()[:12], run.cur.round if run.cur else "-", e)
            self.log.append(f"{type(e).__name__}: {e}")
        finally:
            self.busy.discard(rid)

    # ------------------------------------------------------------------ a worker's round

    async def _train(self, run: Run) -> None:
        await load_torch(self.executor)  # then the imports below, and the fetched tensors, do not stall the loop
        # local: both import torch (~2 s); only a node that trains a round of a run it joined needs them
        from . import rounds as rd
        from .assign import batch_tensors

        me = self.ident.account
        post, cur = run.post, run.cur
        if cur is None:  # step starts this only for an open round
            raise ValueError("the run has no open round")
        t0 = trio.current_time()
        key = (post.run_id, cur.round, cur.attempt)
        if self.fault == "run-copyroot":
            await self._copy_root(run, key)
            return
        cache = await load_run(self.cache, self.executor, self.host, self.blobs, self.model_dir, run)
        theta = await check_theta(cache, self.executor, self.host, self.blobs, self.ledger.state, run)
        prev_id = dict(run.last_opt).get(me)
        prev = None
        if prev_id:
            prev = next((s.opt_after for k, s in self.sealed.items() if commitments_root(s.opt_after) == prev_id),
                        None) or await fetch_blob(self.host, self.blobs, prev_id, [me], timeout=FETCH_TIMEOUT)
        trainer = cache.trainer
        opt_before = await self.executor.run(rd.expected_opt_before, trainer, post, prev)
        a = rd.assignment(post, cur.beacon, cur.round, cur.participants, cache.windows.shape[0], me)
        batches = batch_tensors(cache.windows, a)
        other: list[torch.Tensor] | None = None
        if self.fault == "run-otherdata":
            b = rd.assignment(post, bytes(32), cur.round, cur.participants, cache.windows.shape[0], me)
            other = batch_tensors(cache.windows, b)
        work = await self.executor.run(rd.train_round, trainer, post, theta, opt_before, batches, self.fault,
                                       self.stale.get(post.run_id), self.last_payload.get(post.run_id), other)
        if self.fault == "run-slow":
            await self._straggle(post.run_id, cur.round, cur.attempt, t0)
        self.stale[post.run_id] = theta
        self.last_payload[post.run_id] = work.payload
        now = runs_of(self.ledger.state)[post.run_id].cur
        if now is None or (now.round, now.attempt, now.phase) != (cur.round, cur.attempt, Phase.COMMIT):
            raise RoundClosed("the commit phase closed while training (too slow for its quorum or round_timeout)")
        r = RoundReceipt(self.ledger.chain_id, post.run_id, cur.round, cur.attempt, me, post.sender, run.params,
                         commitments_root(opt_before), commitments_root(work.params_after),
                         commitments_root(work.opt_after), commitments_root(batches),
                         commitments_root(work.payload), work.delta_bytes, work.loss_ppm, post.inner_steps,
                         post.receipt_price).signed(self.ident)
        self.sealed[key] = _Sealed(opt_before, work.params_after, work.opt_after, work.payload, r.id)
        self.committed.add(key)
        await self.ledger.submit(r)
        log.info("run %s round %d: committed (loss %.3f, Δ %d bytes)", post.run_id.hex()[:12], cur.round,
                 work.loss_ppm / 1e6, work.delta_bytes)

    async def _straggle(self, run_id: bytes, round_: int, attempt: int, t0: float) -> None:
        """The ``run-slow`` test switch: a straggler three times slower than the others. Its honest work is held
        until another participant committed in this attempt (or the attempt ended), then twice as long again as
        that took since ``t0`` (trio's clock when it started the round), so it is ready at about 3x the pace of
        the fastest worker, whatever the machine's load."""
        me = self.ident.account
        while True:
            cur = runs_of(self.ledger.state)[run_id].cur
            if cur is None or (cur.round, cur.attempt) != (round_, attempt) or any(w != me for w, _, _ in cur.commits):
                break
            await self.ledger.new_block.wait()
        await trio.sleep(2 * (trio.current_time() - t0))

    async def _copy_root(self, run: Run, key: tuple[bytes, int, int]) -> None:
        """The ``run-copyroot`` cheat (test chains): train nothing, wait for another participant's round receipt of
        this attempt on the ledger, and submit it as ours (our account and signature, its Δ root and every other
        field). The ledger refuses it (a Δ root is committed once per attempt); the refusal is logged."""
        me = self.ident.account
        while True:
            st = self.ledger.state
            cur = runs_of(st)[key[0]].cur
            if cur is None or (cur.round, cur.attempt, cur.phase) != (key[1], key[2], Phase.COMMIT):
                raise ValueError("run-copyroot: the commit phase closed before another worker committed")
            other = next((st.receipts[rid].receipt for w, rid, _ in cur.commits if w != me), None)
            if other is not None:
                break
            await self.ledger.new_block.wait()
        copy = replace(other, worker=me, sig=b"").signed(self.ident)
        self.committed.add(key)
        try:
            await self.ledger.submit(copy)
        except InvalidTx as e:
            log.warning("run-copyroot: round %d: the copy of %s's Δ root %s was refused: %s", key[1],
                        other.worker.hex()[:12], other.delta_root.hex()[:16], e)
            self.log.append(f"copy refused: {e}")
            return
        log.warning("run-copyroot: round %d: the copy of %s's Δ root %s was accepted", key[1],
                    other.worker.hex()[:12], other.delta_root.hex()[:16])
        self.log.append("copy accepted")

    async def _reveal(self, run: Run, key: tuple[bytes, int, int]) -> None:
        """The commit phase of ``key``'s attempt closed: serve what we committed (and reveal it if the reveal
        phase is open). What the ledger never took is never served: if another participant's receipt with our Δ
        root landed first (a copy raced ahead of ours, refused as a duplicate root), serving the bytes would let
        that copier reveal them and be paid for our work."""
        sealed = self.sealed.pop(key)
        if self.ledger.state.receipts.get(sealed.receipt) is None:
            log.warning("run %s round %d attempt %d: our round receipt is not on the ledger; its Δ stays unserved",
                        key[0].hex()[:12], key[1], key[2])
            self.log.append(f"not served: round {key[1]} attempt {key[2]}")
            return
        for ts in (sealed.opt_before, sealed.params_after, sealed.opt_after, sealed.payload):
            self.blobs.put(ts)
        self.revealed.add(key)
        cur = run.cur
        if cur is not None and (cur.round, cur.attempt) == key[1:] and cur.phase == Phase.REVEAL:
            tx = RoundReveal(self.ledger.chain_id, key[0], key[1], key[2], self.ident.account,
                             commitments_root(sealed.payload)).signed(self.ident)
            try:
                await self.ledger.submit(tx)
            except InvalidTx as e:
                log.warning("reveal refused: %s", e)

    # ------------------------------------------------------------------ the aggregator

    async def _aggregate(self, run: Run) -> None:
        await load_torch(self.executor)  # then the imports below, and the fetched tensors, do not stall the loop
        # local: these import torch (~2 s); only a node drawn to aggregate a round needs them
        from . import rounds as rd
        from .assign import screen_tensor
        from .heldout import heldout_loss_ppm

        st = self.ledger.state
        post, cur = run.post, run.cur
        if cur is None:  # step starts this only for an open round
            raise ValueError("the run has no open round")
        self.aggregated.add((post.run_id, cur.round, cur.attempt, cur.aggregator))
        cache = await load_run(self.cache, self.executor, self.host, self.blobs, self.model_dir, run)
        theta = await fetch_blob(self.host, self.blobs, run.params, theta_holders(st, run), timeout=FETCH_TIMEOUT)
        mom = None if run.momentum == NO_MOMENTUM else await fetch_blob(
            self.host, self.blobs, run.momentum, theta_holders(st, run), timeout=FETCH_TIMEOUT)
        opened = attempt_of(run, cur.round, cur.attempt)
        if opened is None:  # the open attempt is always recorded (node.ledger.core.runstate)
            raise ValueError(f"round {cur.round} attempt {cur.attempt} never opened")
        beacon, parts = opened
        payloads: dict[bytes, list[torch.Tensor]] = {}
        screens: dict[bytes, torch.Tensor] = {}
        for w in cur.reveals:
            rec = st.receipts[cur.receipt_of(w)]
            if rec.status == INVALID_S:
                continue
            try:
                payloads[w] = await fetch_blob(self.host, self.blobs, rec.receipt.delta_root, [w],
                                               timeout=FETCH_TIMEOUT)
            except BlobUnavailable as e:
                log.info("Δ of %s unavailable: %s", w.hex()[:12], e)
                continue
            a = rd.assignment(post, beacon, cur.round, parts, cache.windows.shape[0], w)
            screens[w] = screen_tensor(cache.windows, a)
        res, excluded = await self.executor.run(rd.aggregate_round, cache.trainer, post, theta, mom, payloads, screens)
        held_ppm = await self.executor.run(heldout_loss_ppm, cache.trainer, res.params, cache.held)
        params_id = self.blobs.put(res.params)
        mom_id = NO_MOMENTUM if res.momentum is None else self.blobs.put(res.momentum)
        cache.verified.add(params_id)
        tx = RoundAggregate(self.ledger.chain_id, post.run_id, cur.round, cur.attempt, self.ident.account,
                            post.sender, run.params, run.momentum, params_id, mom_id, tuple(sorted(res.accepted)),
                            post.aggregator_fee, heldout_ppm=held_ppm).signed(self.ident)
        await self.ledger.submit(tx)
        log.info("run %s round %d: aggregated %d Δs into θ %s (excluded: %s)", post.run_id.hex()[:12], cur.round,
                 len(res.accepted), params_id.hex(), {w.hex()[:8]: why for w, why in excluded.items()} or "none")
        self.log.append(f"aggregated round {cur.round}: {len(res.accepted)} accepted, excluded {len(excluded)}")
