"""The client side of inference: routing (over the swarm table, :mod:`node.inference.swarm`), failover and greedy
generation through a route.

The client holds the embedding, final norm and LM head (:class:`~node.compute.head.ClientHead`) and sends hidden
states ``(1, tokens, hidden)`` through one session per hop (protocol: :mod:`node.inference.server`): the sessions,
their running receipts and acknowledgements are :mod:`node.inference.hops`'s; before the client pauses for
``on_token`` or gives up a session, every acknowledgement is sent at once.

Routing: :func:`~node.compute.shards.choose_route` over the live announcements (measured throughput, latency,
free cache) plus the client's own measured round trips, each server weighed by its verified record on the ledger
(:mod:`node.compute.standing`: new or punished servers get less work); deterministic for equal inputs.

Failover: when a hop fails (EOF or reset, timeout, error reply, malformed or non-finite output) the client
retires it — keeping the worker-signed receipt for every output it received, which it countersigns and submits
— and routes around it: a replacement chain covering the same blocks, excluding the failed peer, is opened with
``replay = P`` (the positions the dead server processed), fed those ``P`` positions' inputs as one unbilled
step, then the step that failed. Generation continues at the right position, and no position is paid twice.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import trio

from ..blobs import BlobStore
from ..compute.shards import NoRouteError, SpanInfo, choose_route
from ..compute.standing import standings
from ..duty.seams import Executor
from ..identity import Identity
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import Receipt
from ..p2p.quirks import exception_leaves
from .hops import HOP_ERRORS, OPEN_TIMEOUT, Failover, Hop, HopFailed, HopSessions, RouteRun, abort_hop
from .seams import ClientHost, ClientLedger, Discover, Disputes, Head
from .swarm import SwarmTable
from .tabseam import RequesterTabs
from .wire import check_codec

if TYPE_CHECKING:
    import torch

    from ..compute.model import Manifest

ROUTE_WARM_PERIOD = 2.0  # seconds between re-plans of the route kept connected (RouteClient.keep_route_connected)
ROUTE_WARM_MAX = 8  # servers of one route kept connected ahead of a generation
# A new generation whose route is not covered waits this long (seconds) for announcements before NoRouteError: an
# announcement lives 3 refresh periods, and on a loaded machine a refresh can arrive after its predecessor lapsed
ROUTE_WAIT = 5.0
# seconds a server whose hop failed is left out of new routes while another route exists: its record or
# announcement may outlive it (a DHT record lives up to 3 minutes), and every generation would fail over from it
SUSPECT_S = 60.0
MAX_SUSPECTS = 1024  # servers remembered as failed at most (the oldest forgotten first)
ROUTE_POLL = 0.1  # seconds between two looks at the swarm table meanwhile

log = logging.getLogger("tally.client")

Route = list[tuple[str, int, int]]  # [(peer, start, end), ...] of a generation's hops, in order
# ``await on_token(index, token, route)`` after each new token (index from 1)
OnToken = Callable[[int, int, Route], Awaitable[object]]

# HopFailed (node.inference.hops) is re-exported: generate raises it, and node.api.wallet imports it from here
__all__ = ["ROUTE_POLL", "ROUTE_WAIT", "ROUTE_WARM_MAX", "ROUTE_WARM_PERIOD", "Generation", "HopFailed", "OnToken",
           "PromptTooLong", "Route", "RouteClient"]


class PromptTooLong(ValueError):
    """The prompt plus the tokens to generate exceed the model's maximum length."""


@dataclass
class Generation:
    """A finished generation (:meth:`RouteClient.generate`): the prompt, the new ``tokens``, the countersigned
    ``receipts`` of every hop (replaced ones included), the final ``route``, ``seconds`` for the whole call, the
    ``failovers``, the codec and ``first_token_s``."""

    prompt_ids: list[int]
    tokens: list[int]
    receipts: list[Receipt | TabReceipt]
    route: list[tuple[str, int, int]]
    seconds: float
    failovers: list[Failover] = field(default_factory=list)
    compression: str = "none"
    first_token_s: float | None = None  # seconds from the call to the first new token (None: not measured)


@dataclass(frozen=True)
class Replaced:
    """What :meth:`RouteClient._replace` spliced in: hops ``first`` .. ``first + count - 1`` of the route; ``out``
    is this round's output of the chain when its replay carried this round's step (it replaced hops that had run
    it), else None (this round's step goes through the chain next)."""

    first: int
    count: int
    out: torch.Tensor | None


# the client's head: a RouteClient[LazyHead] (the node's) or RouteClient[ClientHead] keeps its head's own type
HeadT = TypeVar("HeadT", bound=Head, covariant=True)


class RouteClient(HopSessions, Generic[HeadT]):
    """Generates text through a route of span servers and settles each session with a countersigned receipt
    (sessions: :class:`~node.inference.hops.HopSessions`).

    Args:
        ident: the requester's identity. host: :class:`~node.p2p.host.P2PHost`. head: ClientHead (or LazyHead).
        manifest: the model's manifest. ledger: anything with ``chain_id``, ``genesis.params``, ``state.height``,
        ``state.account(key)`` and ``async submit(tx)`` (LedgerService). executor: TorchExecutor.
        blobs: BlobStore. swarm: SwarmTable.
        step_timeout: seconds to wait for each reply. compression: default codec (:mod:`node.inference.wire`).
        max_failovers: replacements allowed per generation. submit: submit receipts to the ledger.
        open_timeout: seconds to wait for a session's stream to a server (then it fails over).
        disputes: where the receipts a redundant session caught go (:class:`~node.inference.seams.Disputes`), or
            None: this client disputes nothing.
        discover: where routes come from when servers publish records instead of gossiping announcements
            (:class:`~node.inference.dhtfeed.DhtFeed`), or None: the swarm table's gossip alone.
    """

    def __init__(self, ident: Identity, host: ClientHost, head: HeadT, manifest: Manifest, ledger: ClientLedger,
                 executor: Executor, blobs: BlobStore, swarm: SwarmTable, step_timeout: float = 60.0,
                 compression: str = "none", max_failovers: int = 4, submit: bool = True,
                 tabs: RequesterTabs | None = None, open_timeout: float = OPEN_TIMEOUT,
                 disputes: Disputes | None = None, discover: Discover | None = None):
        super().__init__(ident, host, manifest, ledger, blobs, swarm, step_timeout, tabs, open_timeout)
        self.head, self.executor = head, executor
        self.disputes = disputes
        self.discover = discover
        self._suspects: OrderedDict[str, float] = OrderedDict()  # peer -> monotonic time until which it is left out
        self.compression = check_codec(compression)
        self.max_failovers = max_failovers
        self.submit = submit

    def check_length(self, n_prompt: int, max_new_tokens: int) -> int:
        """Total session length; raises :class:`PromptTooLong` before any session is opened."""
        total = n_prompt + max_new_tokens
        if n_prompt < 1 or max_new_tokens < 1:
            raise PromptTooLong("need at least one prompt token and one new token")
        if total > self.manifest.max_length:
            raise PromptTooLong(f"prompt of {n_prompt} tokens + {max_new_tokens} new tokens = {total} "
                                f"exceeds the model's maximum length of {self.manifest.max_length} tokens")
        return total

    def _plan(self, need: int, start: int = 0, end: int | None = None,
              exclude: Collection[str] = frozenset()) -> list[SpanInfo]:
        """The fastest route over the live announcements now (:func:`~node.compute.shards.choose_route`): blocks
        ``[start, end)``, ``need`` tokens of free cache per hop, neither this node nor ``exclude``, each hop's time
        weighed by its server's standing on the ledger (:mod:`node.compute.standing`, one account read per
        candidate server), leaving out servers whose hop failed less than :data:`SUSPECT_S` seconds ago unless no
        route exists without them. Raises NoRouteError."""
        infos = self.swarm.infos(self.manifest.model_id)
        skip = set(exclude) | {self.host.peer_id}
        standing = standings((s.peer for s in infos if s.peer not in skip), self.ledger.state.account)
        suspects = self._live_suspects() - skip
        try:
            return choose_route(infos, self.manifest.num_blocks, start, end, exclude=skip | suspects,
                                need_cache=need, rtt=self.swarm.rtt, standing=standing)
        except NoRouteError:
            if not suspects:
                raise
        # no route without them: a server that failed once may be back (restarted, or the failure was ours)
        return choose_route(infos, self.manifest.num_blocks, start, end, exclude=skip, need_cache=need,
                            rtt=self.swarm.rtt, standing=standing)

    def _live_suspects(self) -> set[str]:
        """Servers whose hop failed less than :data:`SUSPECT_S` seconds ago (expired ones forgotten)."""
        now = time.monotonic()
        while self._suspects and next(iter(self._suspects.values())) <= now:
            self._suspects.popitem(last=False)
        return set(self._suspects)

    def _suspect(self, peer: str) -> None:
        self._suspects.pop(peer, None)
        self._suspects[peer] = time.monotonic() + SUSPECT_S
        while len(self._suspects) > MAX_SUSPECTS:
            self._suspects.popitem(last=False)

    async def _look_up(self, start: int, end: int, force: bool = False) -> None:
        """Ask the DHT for the records of a route over ``[start, end)`` (no-op without ``discover``)."""
        if self.discover is not None:
            await self.discover.route(self.manifest.model_id, start, end, force)

    async def _first_plan(self, need: int, wait: float = ROUTE_WAIT) -> list[SpanInfo]:
        """The route of a new generation (``need`` tokens of cache per hop). While the live announcements do not
        cover every block, look again every :data:`ROUTE_POLL` seconds for up to ``wait`` seconds: a server whose
        refresh arrived late is back within a period (failover mid-generation does not wait: it excludes the
        dead hop and plans at once).

        Raises:
            NoRouteError: still no route after ``wait`` seconds (the blocks nobody serves named).
        """
        await self._look_up(0, self.manifest.num_blocks)  # before the clock starts: a lookup takes a while
        deadline = trio.current_time() + wait
        while True:
            try:
                return self._plan(need)
            except NoRouteError:
                if trio.current_time() >= deadline:
                    raise
            await trio.sleep(ROUTE_POLL)
            await self._look_up(0, self.manifest.num_blocks, force=True)

    def route(self) -> list[tuple[str, int, int]]:
        """The route a generation would take now, ``[(peer, start, end), ...]`` (raises NoRouteError)."""
        return [(s.peer, s.start, s.end) for s in self._plan(0)]

    async def keep_route_connected(self, period: float = ROUTE_WARM_PERIOD) -> None:
        """Keep a connection open to each server of the route a generation would take now, re-planned every
        ``period`` seconds and whenever a server announces a new span, so that the first generation after the
        swarm is covered opens its sessions on connections that exist (issue 25: a dial through a relay — TCP,
        Noise, yamux and the hello, several round trips — otherwise lands on the first token). Dials are in
        parallel, at most :data:`ROUTE_WARM_MAX` peers, each bounded by ``step_timeout``; a failed dial is one
        DEBUG line and is retried at the next period. Runs until cancelled."""
        while True:
            await self._look_up(0, self.manifest.num_blocks)
            try:
                peers = list(dict.fromkeys(s.peer for s in self._plan(0)))[:ROUTE_WARM_MAX]
            except NoRouteError:
                peers = []
            connected = set(self.host.connected_peers())
            missing = [p for p in peers if p not in connected]
            if missing:
                async with trio.open_nursery() as n:
                    for peer in missing:
                        n.start_soon(self._warm_dial, peer)
            with trio.move_on_after(period):
                await self.swarm.changed.wait()

    async def _warm_dial(self, peer: str) -> None:
        try:
            with trio.move_on_after(self.step_timeout):
                await self._dial(peer)
        except HOP_ERRORS as e:
            log.debug("could not connect ahead to route server %s: %s: %s", peer[:16], type(e).__name__, e)

    # ------------------------------------------------------------------ routes and failover

    async def _open_all(self, run: RouteRun) -> None:
        async def one(hop: Hop) -> None:
            try:
                await self._open(hop, run.total)
            except HOP_ERRORS as e:
                hop.broken = e

        async with trio.open_nursery() as n:
            for hop in run.hops:
                n.start_soon(one, hop)
        i = 0
        while i < len(run.hops):
            broken = run.hops[i].broken
            if broken is not None:
                rep = await self._replace(run, i, broken, 0)
                i = rep.first + rep.count
            else:
                i += 1

    async def _plan_replacement(self, run: RouteRun, i: int) -> tuple[int, int, list[SpanInfo]]:
        """A chain to replace the failed ``run.hops[i]``: over its own blocks if any server covers them, else over
        a wider run of hops ``j..k`` (``j <= i <= k``), narrowest first and, at equal width, the one starting at
        ``i`` first (its neighbours after it have not run this round). Returns ``(j, k, chain)``.

        Raises:
            NoRouteError: no chain covers the failed hop's blocks, however wide (the exact range's error).
        """
        hops, n = run.hops, len(run.hops)
        ranges = sorted(((j, k) for j in range(i + 1) for k in range(i, n)), key=lambda r: (r[1] - r[0], i - r[0]))
        first: NoRouteError | None = None
        for forced in (False, True):
            if forced:  # a server the last lookup did not return
                if self.discover is None:
                    break
                await self._look_up(hops[i].start, hops[i].end, force=True)
            for j, k in ranges:
                try:
                    return j, k, self._plan(run.total, hops[j].start, hops[k].end, run.excluded)
                except NoRouteError as e:
                    first = first or e
        assert first is not None
        raise first

    async def _replace(self, run: RouteRun, i: int, err: Exception, token: int) -> Replaced:
        """Replace the failed ``run.hops[i]`` by a chain covering its blocks, opened and replayed. When no server
        covers exactly its blocks, the chain replaces it with neighbours (:meth:`_plan_replacement`): those are
        closed (paid for what they returned) and the chain replays the inputs of the first of them. A chain that
        starts before the failed hop replays this round's positions too, unbilled, and the route goes on after it:
        no position is paid twice, and the blocks of the hops that had not run this round (the failed one, those
        after it) are paid one round short (billing is per session, and the chain's sessions straddle hops paid
        through different rounds; the requester never pays twice).

        Raises:
            HopFailed: more than ``max_failovers`` replacements in this generation.
            NoRouteError: no other server covers those blocks.
        """
        dead = run.hops[i]
        log.warning("hop %s [%d, %d) failed at token %d: %s: %s", dead.peer[:16], dead.start, dead.end, token,
                    type(err).__name__, err)
        run.excluded.add(dead.peer)
        self._suspect(dead.peer)  # and, for a while, from the next generations' routes
        await abort_hop(dead)
        run.retired.append(dead)
        while True:
            if len(run.failovers) >= self.max_failovers:
                raise HopFailed(f"gave up after {len(run.failovers)} failovers; last error: {err}") from err
            j, k, sub = await self._plan_replacement(run, i)
            lead = run.hops[j]  # the first hop replaced: its inputs are the chain's (this round's too if j < i)
            prefix, positions = list(lead.inputs), lead.positions
            new = [Hop(s.peer, s.start, s.end, run.codec, replay=positions) for s in sub]
            run.failovers.append(Failover(token, dead.peer, (lead.start, run.hops[k].end), [h.peer for h in new],
                                          positions, f"{type(err).__name__}: {err}"))
            current = None
            try:
                for current in new:
                    await self._open(current, run.total)
                x = _cat(prefix)
                for current in new:
                    if x is not None:
                        x = await self._step(current, x, run)  # the replayed prefix: unbilled
            except HOP_ERRORS as e:
                if current is not None:
                    run.excluded.add(current.peer)
                for h in new:
                    await abort_hop(h)
                err = e
                continue
            for h in run.hops[j:k + 1]:
                if h is not dead:  # a live neighbour: closed and settled for what it returned
                    await self._close_quietly(h)
                    run.retired.append(h)
            run.hops[j:k + 1] = new
            log.info("replaced %s (hops %d-%d) by %s after replaying %d positions", dead.peer[:16], j, k,
                     ", ".join(h.peer[:16] for h in new), positions)
            out = x[:, -prefix[-1].shape[1]:] if j < i and x is not None and prefix else None
            return Replaced(j, len(new), out)

    async def _close_quietly(self, hop: Hop) -> None:
        try:
            await self._close(hop)
        except HOP_ERRORS as e:
            log.debug("closing replaced hop %s: %s: %s", hop.peer[:16], type(e).__name__, e)
        await abort_hop(hop)

    async def _forward(self, run: RouteRun, hidden: torch.Tensor, token: int) -> torch.Tensor:
        """One round: ``hidden`` through every hop (failing over as needed). The round's receipt work is left in
        ``run.pending`` for the caller to flush."""
        i = 0
        while i < len(run.hops):
            try:
                hidden = await self._step(run.hops[i], hidden, run)
                i += 1
            except HOP_ERRORS as e:
                await self._flush(run)  # the failed hop's receipt covers every output received from it
                rep = await self._replace(run, i, e, token)
                if rep.out is not None:  # the replacement carried this round's step in its replay: go on after it
                    hidden, i = rep.out, rep.first + rep.count
                # else step through the replacement at the same index
        return hidden

    def _next(self, hidden: torch.Tensor, embed: bool) -> tuple[int, torch.Tensor | None]:
        """Executor thread: the greedy next token after ``hidden`` (1, t, hidden) and, if ``embed``, its
        embedding (1, 1, hidden) for the next round (one thread hop for both)."""
        tok = self.head.next_token(hidden)
        return tok, self.head.embed_ids([tok]) if embed else None

    async def _finish(self, run: RouteRun, close: bool) -> list[Receipt | TabReceipt]:
        """Close (or abort) every session, settle and submit the receipts of all hops, retired ones included."""
        run.bg = None
        await self._flush(run, inline=close)  # closing: the last acknowledgements ride on the close messages
        if not close:
            await self._release_acks(run)
        if close:
            for hop in run.hops:
                await self._close(hop)
        retired = {id(h) for h in run.retired}
        hops = run.retired + [h for h in run.hops if id(h) not in retired]  # a failed hop not yet replaced
        for hop in hops:
            await abort_hop(hop)
        receipts = [r for r in (self._settle(h) for h in hops) if r is not None]
        if self.submit:
            for r in receipts:
                if isinstance(r, TabReceipt):
                    continue  # paid through its tab: the worker commits to it in its epoch batch
                try:
                    await self.ledger.submit(r)
                except Exception as e:  # noqa: BLE001 - one receipt that fails to submit must not lose the others
                    log.warning("could not submit receipt %s: %s", r.id.hex()[:16], e)
        return receipts

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, compression: str | None = None,
                       on_token: OnToken | None = None) -> Generation:
        """Greedy generation of ``max_new_tokens`` tokens after ``prompt_ids`` through the swarm.

        Args:
            compression: codec for this generation (default: the client's), recorded in every receipt.
            on_token: optional ``async on_token(index, token, route)`` called after each new token (index from
                1; ``route`` the current ``[(peer, start, end), ...]``).

        Returns the new tokens, the countersigned receipts (already submitted to the ledger, replaced hops'
        included), the failovers, ``seconds`` (the whole call) and ``first_token_s`` (seconds until the first new
        token; the rest is later tokens and settling the sessions).

        Raises:
            PromptTooLong: checked before any session opens (no receipt, no charge).
            ValueError: unknown compression.
            NoRouteError: the live announcements do not cover every block (at the start after waiting up to
                :data:`ROUTE_WAIT` seconds for them; when failing over, at once).
            HopFailed: too many failovers. Work received before a failure is still settled and paid.
        """
        total = self.check_length(len(prompt_ids), max_new_tokens)
        codec = check_codec(compression or self.compression)
        t0 = time.perf_counter()
        run = RouteRun(total, codec, [Hop(s.peer, s.start, s.end, codec) for s in await self._first_plan(total)])
        first: float | None = None
        try:
            # a lazy head: built there. None after the last token (the next round's input is not embedded)
            hidden: torch.Tensor | None = await self.executor.run(lambda: self.head.embed_ids(prompt_ids))
            t_embed = time.perf_counter()
            await self._open_all(run)  # then the first step follows at once (servers time out idle sessions)
            t_open = time.perf_counter()
            new: list[int] = []
            try:
                async with trio.open_nursery() as run.bg:  # acknowledgements, written off the critical path
                    while True:
                        assert hidden is not None  # None only once the last token is generated (loop ended)
                        hidden = await self._forward(run, hidden, len(new) + 1)
                        await self._flush(run)  # the round's receipt work, before the LM head (no GIL contention)
                        tok, hidden = await self.executor.run(self._next, hidden, len(new) + 1 < max_new_tokens)
                        new.append(tok)
                        if first is None:
                            first = time.perf_counter() - t0
                            log.debug("first token after %.3f s: embed %.3f s, open %d sessions %.3f s, "
                                      "first step %.3f s", first, t_embed - t0, len(run.hops), t_open - t_embed,
                                      first - (t_open - t0))
                        if on_token is not None:
                            await self._release_acks(run)  # the caller may pause: acknowledge everything now
                            for h in run.hops:  # this token's acknowledgements are on the wire first
                                if h.acking is not None:
                                    await h.acking.wait()
                            await on_token(len(new), tok, [(h.peer, h.start, h.end) for h in run.hops])
                        if len(new) >= max_new_tokens:
                            break
            except BaseExceptionGroup as eg:  # the nursery wraps even a lone error: surface it as itself
                leaves = exception_leaves(eg)
                if len(leaves) == 1:
                    raise leaves[0] from None
                raise
        except Exception:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                await self._finish(run, close=False)  # pay for what was received
            raise
        receipts = await self._finish(run, close=True)
        return Generation(list(prompt_ids), new, receipts, [(h.peer, h.start, h.end) for h in run.hops],
                          time.perf_counter() - t0, run.failovers, codec, first)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """``parts`` (each ``(1, tokens, hidden)``) as one tensor along the positions; None when there are none."""
    import torch  # local: torch takes ~2 s to import; a node that never generates never loads it

    return torch.cat(parts, dim=1) if parts else None
