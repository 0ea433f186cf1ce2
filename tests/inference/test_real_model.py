"""The failover and fp16 checks with the real SmolLM2-135M on the in-memory network of ``fakenet.py`` (slow):
real span servers, route client and committee member in one process, their streams trio memory streams (no
libp2p, no processes; a "kill" ends the server's streams the way a SIGKILL does). 3 spans of 10 blocks, two
servers each, the middle one dies after token 17 of 48; the tokens equal one-process generation, and fp16
compression is verified by a committee member. The same failover over real libp2p with one process per server is
``test_real_failover.py``. Uses the default model cache (``ensure_smollm2``)."""

from __future__ import annotations

import pytest
import trio

from node.compute.executor import TorchExecutor
from node.compute.model import ensure_smollm2
from node.compute.reference import local_generate
from node.compute.span import SpanModel
from node.identity import Identity
from node.verify.member import CommitteeMember

from .fakenet import make_swarm

PROMPT = "The three most important inventions in human history are"


@pytest.mark.slow
def test_smollm2_failover_and_fp16_sessions_on_the_in_memory_network(tmp_path):
    model = ensure_smollm2()

    async def main():
        async with trio.open_nursery() as n:
            net, _, client = await make_swarm(n, model, tmp_path,
                                              [(0, 10), (0, 10), (10, 20), (10, 20), (20, 30), (20, 30)])
            prompt = client.head.tokenizer.encode(PROMPT)

            async def on_token(i, tok, route):
                if i == 17:
                    await net.kill(route[1][0])

            gen = await client.generate(prompt, 48, on_token=on_token)
            fp16 = await client.generate(prompt, 16, compression="fp16")
            member = CommitteeMember(Identity.generate(), None, None, client.blobs, TorchExecutor(1),
                                     lambda s, e: SpanModel(model, s, e), client.manifest.model_id, max_spans=3)
            verdicts = [await member.check(r) for r in gen.receipts + fp16.receipts]
            n.cancel_scope.cancel()
            return prompt, gen, fp16, verdicts

    prompt, gen, fp16, verdicts = trio.run(main)
    assert gen.tokens == local_generate(model, prompt, 48)
    (fo,) = gen.failovers
    assert fo.token == 18 and fo.replayed == len(prompt) + 16
    mid = [r for r in gen.receipts if r.span_start == 10]
    assert [r.tokens for r in mid] == [len(prompt) + 16, 31]
    assert all(r.compression == "fp16" for r in fp16.receipts)
    assert [v for v, _ in verdicts] == [0] * len(verdicts), verdicts
    print("distances:", [round(d, 7) for _, d in verdicts], "fp16 tokens equal:",
          fp16.tokens == local_generate(model, prompt, 16))
