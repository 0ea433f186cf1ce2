"""Committee replay of training segments (node/market/check.py) on the tiny model: honest replays across
thread counts pass, every training cheat is caught, and wrong data commitments are caught."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from node.compute.model import make_tiny
from node.compute.train import Trainer, encode_text, split_tokens, state_distance
from node.encoding import commitments_root
from node.ledger.core.jobtx import JobPost, TrainReceipt
from node.ledger.core.tx import INVALID, VALID
from node.market.check import TRAIN_TOLERANCE, replay_segment

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_bytes()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("m"), 0)


def post(**kw):
    base = dict(chain_id="c", sender=b"r" * 32, job_id=b"j" * 16, title="t", model_id=b"m" * 32,
                dataset_root=b"d" * 32, rank=4, targets="q_proj,v_proj", steps=8, batch_size=2, seq_len=16,
                lr_micro=10_000, seed=3, segment_steps=4, price_per_step=1, deadline=100, sample_ppm=0, nonce=0)
    return JobPost(**{**base, **kw})


def spec_of_post(p):
    from node.market.worker import spec_of

    return spec_of(p)


def work(tiny, p, fault=None, threads=None, start=0, end=4, before=None):
    """What a worker commits for steps [start, end): (receipt, state before, state after)."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        t = Trainer(tiny, spec_of_post(p))
        if before is not None:
            t.load_state(before)
        s0 = t.state_tensors()
        ids, _ = split_tokens(encode_text(tiny, TEXT))
        _losses, batches = t.train_steps(ids, start, end, fault)
        s1 = t.state_tensors()
    finally:
        torch.set_num_threads(old)
    r = TrainReceipt("c", p.job_id, b"w" * 32, p.sender, start, end, commitments_root(s0), commitments_root(s1),
                     commitments_root(batches), 1, 4)
    return r, s0, s1


@pytest.mark.parametrize("threads", [1, 2])
def test_honest_replay_across_thread_counts_is_valid(tiny, threads):
    p = post()
    r, s0, s1 = work(tiny, p, threads=threads)
    verdict, d = replay_segment(tiny, p, TEXT, r, s0, s1)  # the committee runs at the suite's thread count
    print(f"worker threads {threads}: distance {d:.3g}")
    assert verdict == VALID and d < TRAIN_TOLERANCE / 10
    r2, s1b, s2 = work(tiny, p, start=4, end=8, before=s1)  # a later segment replays from its state_before
    assert replay_segment(tiny, p, TEXT, r2, s1b, s2)[0] == VALID


@pytest.mark.parametrize("fault", ["skip-steps", "other-data", "fake-adapter"])
def test_each_training_cheat_is_invalid(tiny, fault):
    p = post()
    r, s0, s1 = work(tiny, p, fault=fault)
    verdict, d = replay_segment(tiny, p, TEXT, r, s0, s1)
    assert verdict == INVALID and d > TRAIN_TOLERANCE * 5


def test_wrong_batches_or_initial_state_are_invalid(tiny):
    p = post()
    r, s0, s1 = work(tiny, p)
    from dataclasses import replace

    assert replay_segment(tiny, p, TEXT, replace(r, batches_root=os.urandom(32)), s0, s1)[0] == INVALID
    other_init = Trainer(tiny, spec_of_post(post(seed=99))).state_tensors()
    assert replay_segment(tiny, p, TEXT, replace(r, state_before=commitments_root(other_init)), other_init,
                          s1)[0] == INVALID


def test_diverged_states_compare_by_nan_pattern():
    a = [torch.tensor([1.0, float("nan"), float("inf")]), torch.tensor([3], dtype=torch.int64)]
    assert state_distance(a, [x.clone() for x in a]) == 0.0
    b = [torch.tensor([1.0, 2.0, float("inf")]), a[1]]
    assert state_distance(a, b) == float("inf")
