"""Pure span arithmetic: splitting a model into shards and planning a route through announced servers.

Spans are half-open block ranges ``[start, end)``. No torch here.
"""

from __future__ import annotations

from typing import AbstractSet, Iterable


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
