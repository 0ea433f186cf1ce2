"""Spans on CUDA (``node start --gpu N``): outputs match the CPU within the committee tolerance, batching works
on the device, and a generation through CUDA servers fails over and is verified by a CPU committee. Skipped
without a CUDA device. ``TALLY_TEST_DEVICE=cpu`` runs them on the CPU instead: a dry run of
``scripts/gpu-check`` (imports, fixtures, the harness) on a machine without a GPU."""

from __future__ import annotations

import os

import pytest
import torch
import trio

from node.compute.compare import DEFAULT_TOLERANCE, distance
from node.compute.executor import TorchExecutor
from node.compute.reference import local_generate
from node.compute.span import SpanModel
from node.identity import Identity
from node.inference.batching import StepBatcher

from .fakenet import make_swarm

DEV = os.environ.get("TALLY_TEST_DEVICE", "cuda:0")
pytestmark = pytest.mark.skipif(DEV.startswith("cuda") and not torch.cuda.is_available(),
                                reason="needs a CUDA device (TALLY_TEST_DEVICE=cpu for a dry run)")


def test_cuda_span_matches_cpu_span(tiny):
    cpu, gpu = SpanModel(tiny, 0, 6), SpanModel(tiny, 0, 6, device=DEV)
    assert next(gpu.net.parameters()).device == torch.device(DEV)
    x = torch.randn(1, 7, cpu.hidden_size)
    c1, c2 = cpu.new_cache(), gpu.new_cache()
    outs = [(cpu.forward(x, c1), gpu.forward(x, c2))]
    for _ in range(5):
        s = torch.randn(1, 1, cpu.hidden_size)
        outs.append((cpu.forward(s, c1), gpu.forward(s, c2)))
    for a, b in outs:
        assert b.device.type == "cpu" and b.dtype == torch.float32  # results come back to the host
        assert distance(a, b) < DEFAULT_TOLERANCE / 10, distance(a, b)


def test_batched_steps_on_cuda(tiny):
    span = SpanModel(tiny, 2, 6, device=DEV)
    b = StepBatcher(span, TorchExecutor(1))
    xs = [torch.randn(1, n, span.hidden_size) for n in (2, 5, 9)]
    steps = [torch.randn(1, 1, span.hidden_size) for _ in xs]
    got = [None] * len(xs)

    async def one(i):
        c = span.new_cache()
        await b.forward(xs[i], c)
        got[i] = await b.forward(steps[i], c)

    async def main():
        async with trio.open_nursery() as n:
            for i in range(len(xs)):
                n.start_soon(one, i)

    trio.run(main)
    assert b.batches >= 1
    for i in range(len(xs)):
        c = span.new_cache()
        span.forward(xs[i], c)
        assert distance(got[i], span.forward(steps[i], c)) < 1e-4


def test_generation_through_cuda_servers_fails_over_and_a_cpu_committee_accepts_it(tiny, tmp_path):
    from node.verify.member import CommitteeMember

    prompt = [5, 17, 42, 99]

    async def main():
        async with trio.open_nursery() as n:
            net, _, client = await make_swarm(n, tiny, tmp_path, [(0, 2), (0, 2), (2, 4), (2, 4), (4, 6), (4, 6)],
                                              device=DEV)

            async def on_token(i, tok, route):
                if i == 5:
                    await net.kill(route[1][0])

            gen = await client.generate(prompt, 12, on_token=on_token)
            member = CommitteeMember(Identity.generate(), None, None, client.blobs, TorchExecutor(1),
                                     lambda s, e: SpanModel(tiny, s, e), client.manifest.model_id)  # on the CPU
            verdicts = [await member.check(r) for r in gen.receipts]
            n.cancel_scope.cancel()
            return gen, verdicts

    gen, verdicts = trio.run(main)
    assert len(gen.failovers) == 1 and len(gen.receipts) == 4
    assert gen.tokens == local_generate(tiny, prompt, 12)  # CPU reference
    assert [v for v, _ in verdicts] == [0, 0, 0, 0], verdicts
    print("GPU worker vs CPU committee distances:", [d for _, d in verdicts])
