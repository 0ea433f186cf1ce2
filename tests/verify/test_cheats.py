"""Calibrated comparison under honest noise and against every inference cheat (tiny model, real torch).

Honest: 1000 sessions re-executed as a committee does (one prefill), the worker decoding incrementally with
1 or 2 torch threads and the committee with 1 or 2 threads, as a batch of one or stacked with another session
(a batch of two): zero invalid. Cheats: every sampled session of every cheat kind is invalid.
"""

from __future__ import annotations

import random

import pytest
import torch

from node.compute.cheats import FAULTS
from node.compute.compare import DEFAULT_TOLERANCE, distance, is_valid
from node.compute.model import make_tiny
from node.compute.span import SpanModel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("m"), 0)


@pytest.fixture(scope="module")
def honest(tiny):
    return SpanModel(tiny, 1, 5)


def session(span, x: torch.Tensor, prompt: int) -> torch.Tensor:
    """A worker's committed outputs: prefill ``prompt`` positions, then one position per step."""
    cache = span.new_cache()
    outs = [span.forward(x[:, :prompt], cache)]
    for t in range(prompt, x.shape[1]):
        outs.append(span.forward(x[:, t:t + 1], cache))
    return torch.cat(outs, dim=1)


def with_threads(n, fn, *args):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(old)


@pytest.mark.slow  # out of the default suite for its time (~30 s; it took 18 min here); CI runs it
def test_a_thousand_honest_re_executions_are_all_valid(honest):
    rng = random.Random(0)
    worst, invalid = 0.0, 0
    for i in range(1000):
        n = rng.randint(2, 16)
        prompt = rng.randint(1, n)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(1, n, honest.hidden_size, generator=g) * rng.choice([0.1, 1.0, 10.0])
        committed = with_threads(1 + i % 2, session, honest, x, prompt)
        if (i // 2) % 2:  # the committee batches this session with another one of the same length
            other = torch.randn(1, n, honest.hidden_size, generator=g)
            redo = with_threads(1 + (i // 4) % 2, honest.prefill, torch.cat([x, other]))[:1]
        else:
            redo = with_threads(1 + (i // 4) % 2, honest.prefill, x)
        d = distance(committed, redo)
        worst = max(worst, d)
        invalid += not is_valid(d)
    print(f"1000 honest re-executions: worst distance {worst:.3g} (tolerance {DEFAULT_TOLERANCE:g})")
    assert invalid == 0 and worst < DEFAULT_TOLERANCE / 10


@pytest.mark.parametrize("fault", [f for f in FAULTS if f is not None])
def test_every_cheat_is_caught_in_every_sampled_session(tiny, honest, fault):
    cheat = SpanModel(tiny, 1, 5, fault=fault)
    rng = random.Random(1)
    caught = []
    for i in range(12):
        n = rng.randint(9, 20)  # >= 9 positions: the NaN cheat poisons one position in 8
        x = torch.randn(1, n, honest.hidden_size, generator=torch.Generator().manual_seed(100 + i))
        committed = session(cheat, x, prompt=rng.randint(1, n))
        caught.append(not is_valid(distance(committed, honest.prefill(x))))
    if fault == "replay":
        assert not caught[0] and all(caught[1:])  # the first session is honest, every later one replayed
    else:
        assert all(caught), caught
