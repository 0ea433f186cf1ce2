"""Redundant live sessions (``node start --redundancy 2``): every step on two disjoint routes, compared hop by hop.

Petals' maintainers planned it ("the client asks two servers for the same step and compares", issue 14); BOINC
replicates work the same way (Anderson, "BOINC: A Platform for Volunteer Computing", 2019, §5.2). The client
(:class:`~node.inference.client.RouteClient`, whose sessions, receipts and failover are reused unchanged) opens
route A, the fastest, and route B, the fastest among the servers A does not use (no server in common; failover
replacements keep it so). Each step's input goes through both routes at once. Then, at every block boundary where
a hop of A and a hop of B both end, the two hidden states must be within the committee's tolerance
(:func:`node.compute.compare.distance` ≤ :data:`node.compute.compare.DEFAULT_TOLERANCE`: the bound a committee uses
to vote a re-execution valid), and the two greedy next tokens must be equal. Where the routes split the model
differently, a mismatch is located to the *segment* between two common boundaries, whose hops it names.

A mismatch stops the redundant session (:class:`Mismatch`: the step, the segment, the peers and spans of both
sides, the distance). Both routes' sessions are closed and their receipts — every output received, the differing
step's included — are settled and submitted, and a :class:`~node.ledger.core.disputes.Dispute` is filed for the
receipt of every hop in the differing segment on both sides: the ledger draws a committee for each (no sampling),
which re-executes it; the honest hop is voted valid and paid, the wrong one invalid, its worker slashed and the
client refunded. The client does not judge locally which side is wrong (it could ask a third server for that
span; it does not): the committee's verdict is the one that counts, and the text never depends on either
suspect. The generation finishes on a third route that uses neither side's server of that segment, opened with
``replay = P`` (the positions before the differing step, unbilled) exactly as a failover replacement is
(:mod:`node.inference.client`), fed those positions, then the differing step; so the tokens equal those of an
honest uninterrupted run. The rest of the generation runs on that route alone (not redundantly).

Cost: both routes are paid (the price of redundancy is twice the tokens × blocks), and each step waits for the
slower route; ``bench/inference.py --redundancy 2`` measures tokens/s of both modes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ..compute.compare import DEFAULT_TOLERANCE, distance, is_valid
from ..compute.shards import NoRouteError, SpanInfo
from ..identity import account_from_str
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import Receipt
from ..p2p.quirks import exception_leaves
from .client import Generation, OnToken, Route, RouteClient
from .hops import HOP_ERRORS, Hop, HopFailed, RouteRun, abort_hop
from .seams import Head
from .wire import check_codec

if TYPE_CHECKING:
    import torch

log = logging.getLogger("tally.redundant")

REDUNDANCY_LEVELS = (1, 2)
THIRD_ROUTE_TRIES = 4  # routes tried for the finish when servers of the third route fail to open


class NoDisjointRoutes(NoRouteError):
    """The swarm cannot give two routes without a server in common (``--redundancy 2`` needs them)."""

    def __init__(self, block: int, num_blocks: int, first: list[str]):
        ValueError.__init__(self, f"redundancy 2 needs two routes with no server in common, and the swarm has no "
                                  f"second route avoiding {len(first)} server(s) of the first "
                                  f"({', '.join(p[:16] for p in first)}): no other server offers a span starting "
                                  f"at block {block} (model has {num_blocks} blocks)")
        self.block, self.num_blocks = block, num_blocks


@dataclass
class Mismatch:
    """The two routes disagreed at step ``token`` (1-based) on blocks ``span``: hidden states at its end at
    ``distance`` (relative L2, :mod:`node.compute.compare`) above ``tolerance``, or different next tokens
    (``next_tokens``). ``hops_a``/``hops_b``: ``(peer, start, end)`` of each side's hops in that segment;
    ``disputed``: ids of the receipts sent to a committee; ``finish``: the third route, empty when none exists."""

    token: int
    span: tuple[int, int]
    hops_a: list[tuple[str, int, int]]
    hops_b: list[tuple[str, int, int]]
    distance: float
    tolerance: float
    next_tokens: tuple[int, int] | None = None
    disputed: list[bytes] = field(default_factory=list)
    finish: list[tuple[str, int, int]] = field(default_factory=list)

    def describe(self) -> str:
        def side(hops: Route) -> str:
            return " + ".join(f"{p[:16]} [{s}, {e})" for p, s, e in hops)

        why = (f"next tokens {self.next_tokens[0]} and {self.next_tokens[1]} differ" if self.next_tokens
               else f"hidden states differ by {self.distance:.3g} > tolerance {self.tolerance:g}")
        return f"step {self.token}, blocks [{self.span[0]}, {self.span[1]}): {side(self.hops_a)} vs " \
               f"{side(self.hops_b)}: {why}"


class MismatchUnresolved(HopFailed):
    """A mismatch was found (its receipts disputed) and no third route without the suspects exists."""

    def __init__(self, mismatch: Mismatch, reason: str):
        super().__init__(f"redundant routes disagree at {mismatch.describe()}; the receipts of both were sent to a "
                         f"committee, but the generation cannot finish: {reason}")
        self.mismatch = mismatch


@dataclass
class RedundantGeneration(Generation):
    """A :class:`Generation` with ``redundancy`` 2: ``routes`` the two compared routes as opened, ``mismatch``
    the first disagreement (None for a clean run); ``receipts`` those of every route (both paid)."""

    redundancy: int = 2
    routes: list[list[tuple[str, int, int]]] = field(default_factory=list)
    mismatch: Mismatch | None = None


def check_redundancy(n: int) -> int:
    """``n`` if it is a supported redundancy (1 or 2), else ValueError with the choices."""
    if isinstance(n, bool) or n not in REDUNDANCY_LEVELS:
        raise ValueError(f"redundancy must be one of {', '.join(map(str, REDUNDANCY_LEVELS))}, got {n!r}")
    return n


def _route(run: RouteRun) -> Route:
    return [(h.peer, h.start, h.end) for h in run.hops]


def compare_hops(a: list[Hop], b: list[Hop], tolerance: float = DEFAULT_TOLERANCE
                 ) -> tuple[tuple[int, int], float] | None:
    """The first segment ``(start, end)`` (between block boundaries where a hop of ``a`` and one of ``b`` both end)
    whose end states of the last step differ by more than ``tolerance``, with the distance; None if all agree."""
    out_a = {h.end: h.outputs[-1] for h in a}
    out_b = {h.end: h.outputs[-1] for h in b}
    prev = a[0].start
    for boundary in sorted(set(out_a) & set(out_b)):
        d = distance(out_a[boundary].float(), out_b[boundary].float())
        if not is_valid(d, tolerance):
            return (prev, boundary), d
        prev = boundary
    return None


def _in(hops: list[Hop], span: tuple[int, int]) -> list[Hop]:
    return [h for h in hops if span[0] <= h.start and h.end <= span[1]]


class RedundantClient:
    """Generation on two disjoint routes through ``client`` (a :class:`RouteClient`: its identity, ledger, swarm,
    head, timeouts and failover), compared at every step (module docstring).

    Args:
        tolerance: largest honest distance between the two routes' hidden states (default: the committee's).
        dispute: dispute the differing hops' receipts (through ``client.disputes``, :mod:`node.disputes`).
    """

    def __init__(self, client: RouteClient[Head], tolerance: float = DEFAULT_TOLERANCE, dispute: bool = True):
        self.client, self.tolerance, self.dispute = client, tolerance, dispute

    def routes(self, need: int = 0) -> tuple[list[SpanInfo], list[SpanInfo]]:
        """Two routes ``[SpanInfo, ...]`` with no peer in common: the fastest, and the fastest of the rest; if that
        fails, each alternative first route that avoids one server of the fastest is tried (bounded).

        Raises:
            NoRouteError: no route at all. NoDisjointRoutes: no second, disjoint one.
        """
        c = self.client
        first = c._plan(need)
        candidates = [first] + [alt for alt in (self._try(need, {s.peer}) for s in first) if alt]
        last: NoRouteError | None = None
        for a in candidates:
            try:
                return a, c._plan(need, exclude={s.peer for s in a})
            except NoRouteError as e:
                last = e
        assert last is not None  # candidates holds at least ``first``
        raise NoDisjointRoutes(last.block, last.num_blocks, [s.peer for s in first])

    def _try(self, need: int, exclude: set[str]) -> list[SpanInfo] | None:
        try:
            return self.client._plan(need, exclude=exclude)
        except NoRouteError:
            return None

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, compression: str | None = None,
                       on_token: OnToken | None = None) -> RedundantGeneration:
        """Greedy generation of ``max_new_tokens`` tokens, every step on two disjoint routes (paid twice).

        Args and errors as :meth:`RouteClient.generate`, and:

        Raises:
            NoDisjointRoutes: the swarm has no two routes without a common server (before any session opens).
            MismatchUnresolved: the routes disagreed (the receipts are disputed) and no third route avoids the
                servers of the differing segment.
        """
        c = self.client
        total = c.check_length(len(prompt_ids), max_new_tokens)
        codec = check_codec(compression or c.compression)
        t0 = time.perf_counter()
        ra, rb = self.routes(total)
        shared: set[str] = {s.peer for s in ra} | {s.peer for s in rb}  # failover replacements avoid both routes
        runs = [RouteRun(total, codec, [Hop(s.peer, s.start, s.end, codec) for s in r], excluded=shared)
                for r in (ra, rb)]
        routes = [_route(r) for r in runs]
        receipts: list[Receipt | TabReceipt] = []
        new: list[int] = []
        mismatch: Mismatch | None = None
        finish: RouteRun | None = None
        try:
            # None after the last token (the next round's input is not embedded)
            hidden: torch.Tensor | None = await c.executor.run(lambda: c.head.embed_ids(prompt_ids))
            for run in runs:
                await c._open_all(run)
            try:
                async with trio.open_nursery() as bg:
                    for run in runs:
                        run.bg = bg
                    while len(new) < max_new_tokens:
                        assert hidden is not None  # None only once the last token is generated (loop ended)
                        step_in = hidden
                        outs = await self._both(runs, hidden, len(new) + 1)
                        for run in runs:
                            await c._flush(run)
                            shared.update(h.peer for h in run.hops)
                        (ta, ha), (tb, _) = await c.executor.run(self._tokens, outs, len(new) + 1 < max_new_tokens)
                        mismatch = self._check(runs, len(new) + 1, ta, tb)
                        if mismatch is not None:
                            break
                        new.append(ta)
                        hidden = ha
                        if on_token is not None:
                            for run in runs:
                                await c._release_acks(run)
                                for h in run.hops:
                                    if h.acking is not None:
                                        await h.acking.wait()
                            await on_token(len(new), ta, _route(runs[0]))
            except BaseExceptionGroup as eg:
                leaves = exception_leaves(eg)
                if len(leaves) == 1:
                    raise leaves[0] from None
                raise
            if mismatch is None:
                for run in runs:
                    receipts += await c._finish(run, close=True)
                return RedundantGeneration(list(prompt_ids), new, receipts, routes[0], time.perf_counter() - t0,
                                           runs[0].failovers + runs[1].failovers, codec, routes=routes)
            log.warning("redundant routes disagree at %s", mismatch.describe())
            for run in runs:  # stop both; every output received is settled, the differing step's included
                got = await c._finish(run, close=True)
                receipts += got
                if self.dispute:
                    mismatch.disputed += await self._dispute(got, _in(run.hops, mismatch.span))
            failovers = runs[0].failovers + runs[1].failovers
            runs = []
            finish = await self._finish_route(total, codec, mismatch, prompt_ids, new, step_in)
            await self._continue(finish, list(prompt_ids), new, max_new_tokens, on_token, step_in)
            receipts += await c._finish(finish, close=True)
            return RedundantGeneration(list(prompt_ids), new, receipts, _route(finish), time.perf_counter() - t0,
                                       failovers + finish.failovers, codec, routes=routes, mismatch=mismatch)
        except Exception:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                for run in runs + ([finish] if finish is not None else []):
                    await c._finish(run, close=False)  # pay for what was received
            raise

    async def _both(self, runs: list[RouteRun], hidden: torch.Tensor, token: int) -> list[torch.Tensor]:
        """One step on both routes at once; their final hidden states."""
        outs: list[torch.Tensor | None] = [None, None]

        async def one(i: int) -> None:
            outs[i] = await self.client._forward(runs[i], hidden, token)

        async with trio.open_nursery() as n:
            for i in range(2):
                n.start_soon(one, i)
        if {h.peer for h in runs[0].hops} & {h.peer for h in runs[1].hops}:
            log.warning("failovers made the redundant routes share a server; they are compared anyway")
        a, b = outs
        assert a is not None and b is not None  # both steps returned (or the nursery raised)
        return [a, b]

    def _tokens(self, outs: list[torch.Tensor], embed: bool) -> tuple[tuple[int, torch.Tensor | None],
                                                                      tuple[int, None]]:
        """Executor thread: each route's greedy next token and (for route A) its embedding."""
        return self.client._next(outs[0], embed), (self.client.head.next_token(outs[1]), None)

    def _check(self, runs: list[RouteRun], token: int, ta: int, tb: int) -> Mismatch | None:
        a, b = runs[0].hops, runs[1].hops
        found = compare_hops(a, b, self.tolerance)
        if found is None and ta == tb:
            return None
        if found is None:  # the states agree within tolerance but not the tokens: name the last segment
            ends = sorted({h.end for h in a} & {h.end for h in b})
            span = (ends[-2] if len(ends) > 1 else a[0].start, ends[-1])
            d = distance(a[-1].outputs[-1].float(), b[-1].outputs[-1].float())
            found = (span, d)
        span, d = found
        return Mismatch(token, span, [(h.peer, h.start, h.end) for h in _in(a, span)],
                        [(h.peer, h.start, h.end) for h in _in(b, span)], d, self.tolerance,
                        None if ta == tb else (ta, tb))

    async def _dispute(self, receipts: list[Receipt | TabReceipt], hops: list[Hop]) -> list[bytes]:
        """Dispute the receipt of each of ``hops`` (matched by worker and session id) through the client's
        disputes (:class:`~node.inference.seams.Disputes`: a plain receipt at once, a tab receipt once the batch
        that redeems it is on the ledger)."""
        c = self.client
        want = {(account_from_str(h.peer), h.session_id) for h in hops}
        out = []
        for r in receipts:
            if (r.worker, r.session_id) not in want:
                continue
            try:
                if c.disputes is None:
                    raise ValueError("this client files no disputes")
                await c.disputes.dispute(r)
                out.append(r.id)
            except Exception as e:  # noqa: BLE001 - the ledger says why; the generation goes on
                log.warning("could not dispute receipt %s: %s", r.id.hex()[:16], e)
        return out

    async def _finish_route(self, total: int, codec: str, m: Mismatch, prompt_ids: list[int], new: list[int],
                            step_in: torch.Tensor) -> RouteRun:
        """The third route, opened with ``replay`` = the positions before the differing step (raises
        MismatchUnresolved when none avoids the suspects)."""
        c = self.client
        suspects = {p for p, _, _ in m.hops_a + m.hops_b}
        positions = len(prompt_ids) + len(new) - step_in.shape[1]  # before the differing step
        excluded = set(suspects)
        for _ in range(THIRD_ROUTE_TRIES):
            try:
                plan = c._plan(total, exclude=excluded)
            except NoRouteError as e:
                raise MismatchUnresolved(m, f"no third route avoids {', '.join(p[:16] for p in sorted(suspects))} "
                                            f"({e})") from e
            run = RouteRun(total, codec, [Hop(s.peer, s.start, s.end, codec, replay=positions) for s in plan],
                       excluded=set(excluded))
            current = None
            try:
                for current in run.hops:
                    await c._open(current, total)
            except HOP_ERRORS as e:
                assert current is not None  # the plan has at least one hop
                log.warning("third route: %s did not open: %s", current.peer[:16], e)
                excluded.add(current.peer)
                for h in run.hops:
                    await abort_hop(h)
                continue
            m.finish = _route(run)
            log.info("finishing on a third route: %s", ", ".join(f"{p[:16]} [{s}, {e})" for p, s, e in m.finish))
            return run
        raise MismatchUnresolved(m, f"{THIRD_ROUTE_TRIES} third routes failed to open")

    async def _continue(self, run: RouteRun, prompt_ids: list[int], new: list[int], max_new_tokens: int,
                        on_token: OnToken | None, step_in: torch.Tensor) -> None:
        """Replay the prefix through ``run`` (unbilled), then redo the differing step (input ``step_in``) and
        generate the rest, appending to ``new``."""
        c = self.client
        positions = run.hops[0].replay
        ids = None
        if positions:
            # every position before the differing step, as token ids: the prompt and the tokens accepted
            prefix = (prompt_ids + new)[:positions]
            ids = await c.executor.run(c.head.embed_ids, prefix)
        try:
            async with trio.open_nursery() as run.bg:
                if ids is not None:
                    await c._forward(run, ids, len(new) + 1)  # the replayed prefix: no position billed
                hidden: torch.Tensor | None = step_in  # None after the last token
                while True:
                    assert hidden is not None  # None only once the last token is generated (loop ended)
                    hidden = await c._forward(run, hidden, len(new) + 1)
                    await c._flush(run)
                    tok, hidden = await c.executor.run(c._next, hidden, len(new) + 1 < max_new_tokens)
                    new.append(tok)
                    if on_token is not None:
                        await c._release_acks(run)
                        for h in run.hops:
                            if h.acking is not None:
                                await h.acking.wait()
                        await on_token(len(new), tok, _route(run))
                    if len(new) >= max_new_tokens:
                        break
        except BaseExceptionGroup as eg:
            leaves = exception_leaves(eg)
            if len(leaves) == 1:
                raise leaves[0] from None
            raise
