"""Beacon-drawn batch assignment: disjoint within a round, right chunk sizes, unpredictable across rounds and
beacons, deterministic, and a clear error when the dataset is too small."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from node.encoding import H, commitments_root
from node.training.assign import (
    Assignment,
    assign_round,
    batch_tensors,
    batches_root,
    make_windows,
    round_seed,
    screen_tensor,
    window_order,
)

BEACON = H(b"beacon")
RUN = H(b"run")
WORKERS = [H(b"w%d" % i) for i in range(4)]


def _indices(a: Assignment) -> list[int]:
    return [i for b in a.batches for i in b] + list(a.screen)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), h=st.integers(1, 4), b=st.integers(1, 4), sw=st.integers(0, 3), spare=st.integers(0, 20),
       round_=st.integers(0, 2**32 - 1))
def test_disjoint_and_sized(k, h, b, sw, spare, round_):
    workers = [H(b"x%d" % i) for i in range(k)]
    n = k * (h * b + sw) + spare
    out = assign_round(BEACON, RUN, round_, workers, n, h, b, sw)
    assert set(out) == set(workers)
    seen: list[int] = []
    for a in out.values():
        assert len(a.batches) == h and all(len(x) == b for x in a.batches) and len(a.screen) == sw
        seen += _indices(a)
    assert len(seen) == len(set(seen)) == k * (h * b + sw)  # disjoint across workers, no window twice
    assert all(0 <= i < n for i in seen)


def test_exactly_full_dataset_is_a_permutation():
    out = assign_round(BEACON, RUN, 0, WORKERS, 4 * 7, 3, 2, 1)
    assert sorted(i for a in out.values() for i in _indices(a)) == list(range(28))
    # the chunks follow the workers' account order on one permutation
    perm = window_order(round_seed(BEACON, RUN, 0), 28)
    assert [i for w in sorted(WORKERS) for i in _indices(out[w])] == perm
    assert perm != list(range(28))


def test_deterministic_and_independent_of_worker_order():
    a = assign_round(BEACON, RUN, 3, WORKERS, 200, 5, 4, 2)
    b = assign_round(BEACON, RUN, 3, list(reversed(WORKERS)), 200, 5, 4, 2)
    assert a == b


def test_differs_across_rounds_beacons_and_runs():
    base = assign_round(BEACON, RUN, 1, WORKERS, 500, 5, 4, 2)
    others = [assign_round(BEACON, RUN, 2, WORKERS, 500, 5, 4, 2),
              assign_round(H(b"other beacon"), RUN, 1, WORKERS, 500, 5, 4, 2),
              assign_round(BEACON, H(b"other run"), 1, WORKERS, 500, 5, 4, 2)]
    for o in others:
        for w in WORKERS:
            # 22 of 500 windows each: sharing most of them by chance is essentially impossible
            assert len(set(_indices(o[w])) & set(_indices(base[w]))) < 11


def test_dataset_too_small_and_bad_args():
    assign_round(BEACON, RUN, 0, WORKERS, 4 * (3 * 2 + 1), 3, 2, 1)  # exactly enough
    with pytest.raises(ValueError, match="dataset too small"):
        assign_round(BEACON, RUN, 0, WORKERS, 4 * (3 * 2 + 1) - 1, 3, 2, 1)
    with pytest.raises(ValueError):
        assign_round(BEACON, RUN, 0, WORKERS + WORKERS[:1], 1000, 3, 2, 1)  # duplicate worker
    with pytest.raises(ValueError):
        assign_round(b"short", RUN, 0, WORKERS, 1000, 3, 2, 1)
    with pytest.raises(ValueError):
        assign_round(BEACON, RUN, -1, WORKERS, 1000, 3, 2, 1)
    with pytest.raises(ValueError):
        assign_round(BEACON, RUN, 0, WORKERS, 1000, 0, 2, 1)
    with pytest.raises(ValueError):
        assign_round(BEACON, RUN, 0, WORKERS, 1000, 3, 2, -1)
    assert assign_round(BEACON, RUN, 0, [], 0, 3, 2, 1) == {}


def test_make_windows_non_overlapping_in_order():
    ids = torch.arange(23, dtype=torch.int32)
    w = make_windows(ids, 4)
    assert w.dtype == torch.int64 and w.shape == (4, 5)
    assert w.reshape(-1).tolist() == list(range(20))  # the trailing 3 tokens are left out
    with pytest.raises(ValueError):
        make_windows(torch.arange(4), 4)
    with pytest.raises(ValueError):
        make_windows(torch.arange(40).float(), 4)
    with pytest.raises(ValueError):
        make_windows(torch.arange(40).reshape(4, 10), 4)


def test_batches_root_commits_to_the_assigned_windows():
    ids = torch.arange(10_000) % 320
    windows = make_windows(ids, 15)
    out = assign_round(BEACON, RUN, 0, WORKERS, windows.shape[0], 3, 2, 2)
    a = out[WORKERS[0]]
    bt = batch_tensors(windows, a)
    assert len(bt) == 3 and all(t.shape == (2, 16) and t.dtype == torch.int64 for t in bt)
    assert torch.equal(bt[1][0], windows[a.batches[1][0]])
    assert screen_tensor(windows, a).shape == (2, 16)
    root = batches_root(windows, a)
    assert root == commitments_root(bt)
    assert root != batches_root(windows, out[WORKERS[1]])
    with pytest.raises(ValueError):
        batches_root(windows[:3], a)  # indices beyond the windows given
