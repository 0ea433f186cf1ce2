"""Pure span arithmetic: splitting a model into shards, planning routes through announced servers (by
measured speed, free cache and ledger standing) and choosing which blocks a new server should serve.

Spans are half-open block ranges ``[start, end)``. No torch here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Set as AbstractSet
from dataclasses import dataclass


class NoRouteError(ValueError):
    """No chain of announced spans covers the model; ``block`` is the first block that cannot be reached."""

    def __init__(self, block: int, num_blocks: int):
        super().__init__(f"no server offers a span starting at block {block} (model has {num_blocks} blocks)")
        self.block = block
        self.num_blocks = num_blocks


def assign_spans(num_blocks: int, n: int) -> list[tuple[int, int]]:
    """Split ``[0, num_blocks)`` into ``n`` contiguous spans whose sizes differ by at most one (larger first).

    Example: ``assign_spans(30, 4) == [(0, 8), (8, 16), (16, 23), (23, 30)]``.

    Raises:
        ValueError: ``num_blocks < 1``, ``n < 1`` or ``n > num_blocks``.
    """
    if num_blocks < 1 or n < 1 or n > num_blocks:
        raise ValueError(f"cannot split {num_blocks} blocks into {n} non-empty spans")
    q, r = divmod(num_blocks, n)
    spans, start = [], 0
    for i in range(n):
        end = start + q + (1 if i < r else 0)
        spans.append((start, end))
        start = end
    return spans


def plan_route(
    announcements: Iterable[tuple[str, int, int]],
    num_blocks: int,
    exclude: AbstractSet[str] = frozenset(),
) -> list[tuple[str, int, int]]:
    """Greedy route ``[(peer, start, end), ...]`` from block 0 to ``num_blocks``.

    At each position the candidates are the announced spans starting exactly there (peers in ``exclude`` and
    spans that are empty or leave ``[0, num_blocks)`` are ignored); the one reaching farthest wins, ties broken
    by the smaller peer id string.

    Raises:
        ValueError: ``num_blocks < 1``.
        NoRouteError: some position has no candidate; ``.block`` names it.
    """
    if num_blocks < 1:
        raise ValueError("num_blocks must be positive")
    best: dict[int, tuple[int, str]] = {}
    for peer, start, end in announcements:
        if peer in exclude or not 0 <= start < end <= num_blocks:
            continue
        cur = best.get(start)
        if cur is None or end > cur[0] or (end == cur[0] and peer < cur[1]):
            best[start] = (end, peer)
    route: list[tuple[str, int, int]] = []
    pos = 0
    while pos < num_blocks:
        if pos not in best:
            raise NoRouteError(pos, num_blocks)
        end, peer = best[pos]
        route.append((peer, pos, end))
        pos = end
    return route


# ------------------------------------------------------------------ routing by measured speed (pure)

HOP_OVERHEAD_S = 0.0005  # seconds added per hop (client-side framing and bookkeeping): fewer hops win ties
UNKNOWN_HOP_S = 0.05  # seconds assumed for a server that announced neither latency nor throughput


@dataclass(frozen=True)
class SpanInfo:
    """One server's announced span and measurements.

    ``throughput``: tokens per second it pushes through its whole span in decoding steps (0: unknown).
    ``latency``: seconds it takes to serve one decoding step, queueing included (0: unknown).
    ``free_cache``: tokens of KV cache it can still hold for new sessions (``None``: not announced).
    """

    peer: str
    start: int
    end: int
    throughput: float = 0.0
    latency: float = 0.0
    free_cache: int | None = None

    def step_seconds(self) -> float:
        """Estimated server time of one decoding step: the larger of announced latency and 1/throughput."""
        known = [x for x in (self.latency, 1.0 / self.throughput if self.throughput > 0 else 0.0) if x > 0]
        return max(known) if known else UNKNOWN_HOP_S


def choose_route(spans: Iterable[SpanInfo], num_blocks: int, start: int = 0, end: int | None = None,
                 exclude: AbstractSet[str] = frozenset(), need_cache: int = 0,
                 rtt: Mapping[str, float] | None = None,
                 standing: Mapping[str, float] | None = None) -> list[SpanInfo]:
    """Fastest chain of announced spans covering blocks ``[start, end)`` (default: the whole model).

    The estimated time of a route is the sum over its hops of ``(span.step_seconds() + rtt[peer] +
    HOP_OVERHEAD_S) * standing[peer]`` (``rtt``: the client's measured network round trip to a peer, seconds,
    default 0; ``standing``: a peer's cost factor >= 1 from its ledger record, default 1, see
    :mod:`node.compute.standing`: a slower server with a proven record can win over a faster new or punished
    one, and a factor never excludes a server), each hop rounded to microseconds; among routes of equal time
    the one whose peer-id sequence sorts first wins, so the result depends only on the inputs. Spans must be
    entered at their start and left at their end; spans of excluded peers, spans outside ``[start, end)`` and
    spans whose ``free_cache`` is below ``need_cache`` tokens are ignored.

    Returns:
        ``[SpanInfo, ...]`` from ``start`` to ``end``.

    Raises:
        ValueError: ``num_blocks < 1``, a bad ``[start, end)``, or a standing factor below 1 or not finite.
        NoRouteError: no chain covers the range; ``.block`` is the farthest block reachable from ``start``.
    """
    end = num_blocks if end is None else end
    if num_blocks < 1 or not 0 <= start < end <= num_blocks:
        raise ValueError(f"bad block range [{start}, {end}) for a model of {num_blocks} blocks")
    rtt, standing = rtt or {}, standing or {}
    bad = {p: f for p, f in standing.items() if not 1.0 <= f < math.inf}
    if bad:
        raise ValueError(f"standing factors must be finite and >= 1: {bad}")
    edges: dict[int, list[tuple[int, SpanInfo]]] = {}
    for s in spans:
        if s.peer in exclude or not start <= s.start < s.end <= end:
            continue
        if s.free_cache is not None and s.free_cache < need_cache:
            continue
        hop_s = s.step_seconds() + max(0.0, rtt.get(s.peer, 0.0)) + HOP_OVERHEAD_S
        cost = round(hop_s * standing.get(s.peer, 1.0) * 1e6)
        edges.setdefault(s.start, []).append((cost, s))
    best: dict[int, tuple[int, tuple[str, ...]]] = {start: (0, ())}
    back: dict[int, tuple[int, SpanInfo]] = {}
    heap: list[tuple[int, tuple[str, ...], int]] = [(0, (), start)]
    done: set[int] = set()
    while heap:
        cost, peers, pos = heapq.heappop(heap)
        if pos in done:
            continue
        done.add(pos)
        if pos == end:
            break
        for c, s in edges.get(pos, ()):
            key = (cost + c, peers + (s.peer,))
            if s.end not in best or key < best[s.end]:
                best[s.end] = key
                back[s.end] = (pos, s)
                heapq.heappush(heap, (key[0], key[1], s.end))
    if end not in done:
        raise NoRouteError(max(done), num_blocks)
    route: list[SpanInfo] = []
    pos = end
    while pos != start:
        pos, s = back[pos]
        route.append(s)
    return route[::-1]


def block_coverage(spans: Iterable[SpanInfo], num_blocks: int, exclude: AbstractSet[str] = frozenset()) -> list[float]:
    """Per block, the summed throughput (tokens/s) of the servers covering it; an unknown throughput counts 1."""
    cover = [0.0] * num_blocks
    for s in sorted(spans, key=lambda x: (x.peer, x.start)):  # fixed order: identical sums for identical input
        if s.peer in exclude or not 0 <= s.start < s.end <= num_blocks:
            continue
        for b in range(s.start, s.end):
            cover[b] += s.throughput if s.throughput > 0 else 1.0
    return cover


def choose_blocks(n: int, num_blocks: int, spans: Iterable[SpanInfo], me: str = "") -> tuple[int, int]:
    """The span of ``n`` blocks a new server should serve: the weakest-covered window (Petals' block selection).

    Coverage is :func:`block_coverage` of the other servers' announcements (``me`` excluded). Each window
    ``[i, i + n)`` is scored by its coverages sorted ascending; the lexicographically smallest list wins, so
    uncovered blocks come first, then the least throughput; ties go to the smallest ``i`` (started one after
    another, servers tile the model from block 0).

    Raises:
        ValueError: ``n`` not in ``1..num_blocks``.
    """
    if not 1 <= n <= num_blocks:
        raise ValueError(f"cannot serve {n} of {num_blocks} blocks")
    cover = block_coverage(spans, num_blocks, exclude={me} if me else frozenset())
    best = min((sorted(cover[i:i + n]), i) for i in range(num_blocks - n + 1))
    return best[1], best[1] + n
