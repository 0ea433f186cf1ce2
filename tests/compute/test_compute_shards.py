"""Span assignment and route planning (pure)."""

from __future__ import annotations

import itertools

import pytest

from node.compute.shards import NoRouteError, assign_spans, plan_route


@pytest.mark.parametrize("num_blocks,n", [(30, 1), (30, 3), (30, 4), (30, 7), (6, 6), (7, 2), (1, 1)])
def test_assign_spans_covers(num_blocks, n):
    spans = assign_spans(num_blocks, n)
    assert len(spans) == n and spans[0][0] == 0 and spans[-1][1] == num_blocks
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    sizes = [e - s for s, e in spans]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_assign_spans_examples_and_errors():
    assert assign_spans(30, 3) == [(0, 10), (10, 20), (20, 30)]
    assert assign_spans(30, 4) == [(0, 8), (8, 16), (16, 23), (23, 30)]
    for args in ((0, 1), (5, 0), (3, 4), (5, -1)):
        with pytest.raises(ValueError):
            assign_spans(*args)


def test_plan_route_covers_and_prefers_farthest():
    ann = [("a", 0, 2), ("b", 0, 3), ("c", 3, 6), ("d", 2, 6), ("e", 3, 5), ("f", 5, 6)]
    assert plan_route(ann, 6) == [("b", 0, 3), ("c", 3, 6)]
    assert plan_route(ann, 6, exclude={"b"}) == [("a", 0, 2), ("d", 2, 6)]
    assert plan_route(ann, 6, exclude={"b", "c"}) == [("a", 0, 2), ("d", 2, 6)]
    assert plan_route(ann, 6, exclude={"a", "c"}) == [("b", 0, 3), ("e", 3, 5), ("f", 5, 6)]


def test_plan_route_ties_by_peer_id():
    ann = [("zeta", 0, 3), ("alpha", 0, 3), ("mid", 0, 3), ("q", 3, 6), ("p", 3, 6)]
    assert plan_route(ann, 6) == [("alpha", 0, 3), ("p", 3, 6)]
    assert plan_route(list(reversed(ann)), 6) == [("alpha", 0, 3), ("p", 3, 6)]
    assert plan_route(ann, 6, exclude={"alpha"})[0] == ("mid", 0, 3)


def test_no_route_error_names_block():
    ann = [("a", 0, 2), ("b", 3, 6)]
    with pytest.raises(NoRouteError, match="block 2") as ei:
        plan_route(ann, 6)
    assert ei.value.block == 2 and isinstance(ei.value, ValueError)
    with pytest.raises(NoRouteError) as ei:
        plan_route(ann, 6, exclude={"a"})
    assert ei.value.block == 0
    with pytest.raises(NoRouteError) as ei:
        plan_route([], 4)
    assert ei.value.block == 0
    # a span running past the model is ignored, as are empty or negative spans
    with pytest.raises(NoRouteError) as ei:
        plan_route([("a", 0, 4), ("b", 4, 9), ("c", 4, 4)], 6)
    assert ei.value.block == 4
    with pytest.raises(ValueError):
        plan_route([("a", 0, 1)], 0)


def test_plan_route_mid_span_entry_not_used():
    # "b" covers block 2 but starts at 1: a route cannot enter a span in the middle
    with pytest.raises(NoRouteError) as ei:
        plan_route([("a", 0, 2), ("b", 1, 4)], 4)
    assert ei.value.block == 2
