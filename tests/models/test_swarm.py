"""An added Gemma3 (sliding-window and global layers, q/k norms, two rope bases, soft-capping) served by 3 real
SpanServers to a real RouteClient (the in-memory stream harness of tests/inference): tokens equal the untouched
transformers model in one process, and the committee re-executes every receipt to VALID."""

from __future__ import annotations

import torch
import trio

from node.compute.executor import TorchExecutor
from node.compute.reference import local_generate
from node.compute.span import SpanModel
from node.identity import Identity
from node.ledger.core.tx import VALID
from node.verify.member import CommitteeMember

from ..inference.fakenet import make_swarm

SPANS = [(0, 1), (1, 3), (3, 4)]


def test_gemma3_through_three_servers_equals_transformers(checkpoints, added, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = added[1]["gemma3_text"]
    prompt = [5, 17, 42, 99, 7]

    async def main():
        with trio.fail_after(120):
            async with trio.open_nursery() as n:
                _, _, client = await make_swarm(n, model_dir, tmp_path, SPANS)
                gen = await client.generate(prompt, 8)
                member = CommitteeMember(Identity.generate(), None, None, client.blobs, TorchExecutor(1),
                                         lambda s, e: SpanModel(model_dir, s, e), client.manifest.model_id)
                verdicts = [await member.check(r) for r in gen.receipts]
                n.cancel_scope.cancel()
                return gen, verdicts

    gen, verdicts = trio.run(main)
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoints["gemma3_text"]), dtype=torch.float32,
                                              trust_remote_code=False).eval()
    assert gen.tokens == local_generate(model_dir, prompt, 8, model=hf)
    assert len(gen.receipts) == 3 and [v for v, _ in verdicts] == [VALID] * 3
