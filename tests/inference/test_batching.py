"""Server-side batching of concurrent one-token steps (real tiny span, no network)."""

from __future__ import annotations

import torch
import trio

from node.compute.compare import distance
from node.compute.executor import TorchExecutor
from node.compute.span import SpanModel
from node.inference.batching import StepBatcher


def test_concurrent_decode_steps_are_batched_and_match_one_at_a_time(tiny):
    span = SpanModel(tiny, 1, 5)
    H = span.hidden_size
    prefixes = [3, 11, 1, 7]
    torch.manual_seed(0)
    xs = [torch.randn(1, n, H) for n in prefixes]
    steps = [[torch.randn(1, 1, H) for _ in range(6)] for _ in prefixes]
    batcher = StepBatcher(span, TorchExecutor(1))
    got = [[] for _ in prefixes]

    async def session(i):
        cache = span.new_cache()
        got[i].append(await batcher.forward(xs[i], cache))  # a prefill: runs alone
        for x in steps[i]:
            got[i].append(await batcher.forward(x, cache))

    async def main():
        async with trio.open_nursery() as n:
            for i in range(len(prefixes)):
                n.start_soon(session, i)

    trio.run(main)
    assert batcher.batches > 0 and batcher.batched_steps >= 2 * batcher.batches
    for i in range(len(prefixes)):
        ref_cache = span.new_cache()
        ref = [span.forward(xs[i], ref_cache)] + [span.forward(x, ref_cache) for x in steps[i]]
        for a, b in zip(got[i], ref, strict=False):
            assert distance(a, b) < 1e-5  # per-token relative L2, as committees measure


def test_faulty_spans_and_long_caches_are_not_batched(tiny):
    span = SpanModel(tiny, 0, 2, fault="corrupt")
    b = StepBatcher(span, TorchExecutor(1))
    cache = span.new_cache()
    span.forward(torch.randn(1, 2, span.hidden_size), cache)
    from node.inference.batching import _Req

    assert not b._batchable(_Req(torch.randn(1, 1, span.hidden_size), cache))
    clean = StepBatcher(SpanModel(tiny, 0, 2), TorchExecutor(1), max_len=1)
    assert not clean._batchable(_Req(torch.randn(1, 1, span.hidden_size), cache))  # 2 cached > max_len
    assert not clean._batchable(_Req(torch.randn(1, 2, span.hidden_size), cache))  # not a one-token step
