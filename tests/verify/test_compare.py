"""The comparison metric and its tolerance, measured on honest and corrupted re-executions of the tiny model.

Honest differences measured here: incremental decoding (KV cache, one token per step) versus one prefill,
at 1 and 2 torch threads. The tolerance (1e-3 relative L2 per token) sits orders of magnitude above them and
orders of magnitude below the corrupt fault's distance.
"""

from __future__ import annotations

import math

import pytest
import torch

from node.compute.compare import DEFAULT_TOLERANCE, distance, is_valid, to_ppm
from node.compute.model import make_tiny
from node.compute.span import SpanModel


@pytest.fixture(scope="module")
def span(tmp_path_factory):
    return SpanModel(make_tiny(tmp_path_factory.mktemp("m"), 0), 0, 6)


def incremental(span, x, prompt_len):
    cache = span.new_cache()
    outs = [span.forward(x[:, :prompt_len], cache)]
    for t in range(prompt_len, x.shape[1]):
        outs.append(span.forward(x[:, t:t + 1], cache))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("threads", [1, 2])
def test_honest_incremental_vs_prefill_is_far_below_tolerance(span, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        worst = 0.0
        for seed in range(20):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(1, 24, span.hidden_size, generator=g)
            worst = max(worst, distance(incremental(span, x, 5), span.prefill(x)))
    finally:
        torch.set_num_threads(old)
    print(f"threads={threads}: worst honest distance {worst:.3g}")
    assert worst < DEFAULT_TOLERANCE / 10  # measured ~1.5e-5 on random inputs: a margin of ~60x


def test_corrupt_outputs_nan_and_half_tokens_are_caught(span):
    bad = SpanModel(span.model_dir, 0, 6, fault="corrupt")
    x = torch.randn(1, 12, span.hidden_size, generator=torch.Generator().manual_seed(1))
    ref = span.prefill(x)
    assert not is_valid(distance(incremental(bad, x, 4), ref))
    y = ref.clone()
    y[0, 3, 0] = float("nan")
    assert distance(y, ref) == math.inf and to_ppm(math.inf) == 2**31 - 1
    half = ref.clone()
    half[:, 6:] = x[:, 6:]  # only the first half of the tokens processed
    assert not is_valid(distance(half, ref))
    assert distance(ref[:, :6], ref) == math.inf  # shape mismatch
