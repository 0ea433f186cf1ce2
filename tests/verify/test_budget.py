"""Issue 36: committee duty within a memory budget. A span over the member's budget is re-executed block by block
from disk (bit for bit the whole span's output), a span that fits is kept within the budget, a member that cannot
hold one block abstains, and a node whose span does not fit its --max-memory is refused at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trio

from node.compute.budget import RESERVE, BudgetError, MemoryBudget, block_bytes, head_bytes, plan_budget
from node.compute.model import load_manifest, make_tiny
from node.compute.offload import StreamedSpan
from node.compute.reference import local_generate
from node.compute.span import SpanModel
from node.ledger.core.state import VALID_S
from node.models.convert import add_model
from node.models.lookup import model_dir_of
from node.verify.member import CommitteeMember, OverBudget

from ..e2e.swarm import swarm, wait_final
from ..models.synth_gguf import write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    src = write_llama_gguf(d / "m.gguf", blocks=4, hidden=256, ffn=512, heads=4, kv_heads=2, type_name="Q4_K")
    return model_dir_of(add_model(src, d / "cache").name, d / "cache")


@pytest.mark.parametrize("which", ["tiny", "gguf_model"])
def test_block_by_block_equals_the_whole_span_bit_for_bit(request, which):
    d = request.getfixturevalue(which)
    m = load_manifest(d)
    x = torch.randn(2, 9, m.hidden_size)
    streamed = StreamedSpan(d, 1, m.num_blocks)
    assert torch.equal(streamed.prefill(x), SpanModel(d, 1, m.num_blocks).prefill(x))
    assert streamed.blocks_loaded == m.num_blocks - 1  # one load per block: never the span at once


def _member(model_dir: Path, budget: int | None) -> CommitteeMember:
    """A member whose span choice (``_span``) is under test; it needs no network for that."""
    loads: list[tuple[int, int]] = []

    def load_span(s: int, e: int) -> SpanModel:
        loads.append((s, e))
        return SpanModel(model_dir, s, e)

    m = CommitteeMember(None, None, None, None, None, load_span, load_manifest(model_dir).model_id,
                        model_dir=model_dir, budget=budget, max_spans=8)
    m.loads = loads
    return m


def test_a_member_keeps_spans_within_its_budget_streams_larger_ones_and_abstains_below_one_block(tiny):
    block = block_bytes(tiny)
    m = _member(tiny, 3 * block)
    assert isinstance(m._span(0, 2), SpanModel) and isinstance(m._span(2, 3), SpanModel)
    assert m.memory_view()["committee_held"] == 3 * block
    assert isinstance(m._span(3, 5), SpanModel)  # room made: the least recently used span (0, 2) went
    assert m.memory_view()["committee_held"] <= 3 * block and (0, 2) not in m._spans
    assert isinstance(m._span(0, 6), StreamedSpan) and m.streamed == 1  # six blocks: over the budget
    assert m.loads == [(0, 2), (2, 3), (3, 5)]
    small = _member(tiny, block - 1)
    with pytest.raises(OverBudget, match="one block"):
        small._span(0, 1)
    assert small.over_budget == 1 and small.loads == []
    assert isinstance(_member(tiny, None)._span(0, 6), SpanModel)  # no budget: as before


def test_a_span_that_does_not_fit_max_memory_is_refused_with_what_it_needs(tiny, tmp_path):
    block, m = block_bytes(tiny), load_manifest(tiny)
    b = plan_budget(RESERVE + 2 * block + head_bytes(m) + 5, tiny, (0, 2), warm_head=True)
    assert (b.span, b.head, b.committee) == (2 * block, head_bytes(m), 5)
    with pytest.raises(BudgetError, match=r"cannot hold its span .* \+ its client head .* \+ a reserve"):
        plan_budget(RESERVE + 2 * block, tiny, (0, 2), warm_head=True)
    r = subprocess.run([sys.executable, "-m", "node.cli", "start", "--data-dir", str(tmp_path / "n"), "--model",
                        "tiny", "--model-cache", str(tmp_path / "models"), "--span", "0:6", "--max-memory", "0.5"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 1 and "--max-memory 0.50 GiB cannot hold its span" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "n" / "node.json").exists()


def test_members_over_budget_stream_and_vote_every_receipt_valid(tmp_path, gguf_model):
    """Three servers of the GGUF-stored model, each with room for one block of another's two-block span: every
    receipt is re-executed block by block from disk and voted valid, none abstained."""
    block = block_bytes(gguf_model)
    budgets = {i: MemoryBudget(total=3 * block + block // 2, block=block, span=2 * block, head=0, reserve=0)
               for i in (1, 2)}
    budgets[3] = MemoryBudget(total=block + block // 2, block=block, span=0, head=0, reserve=0)

    async def main():
        async with swarm(tmp_path, gguf_model, [(0, 2), (2, 4), (0, 4)], budgets=budgets) as nodes:
            client = nodes[0]
            gen = await client.generate([3, 1, 4, 1, 5], 4)
            recs = await wait_final(client, [r.id for r in gen.receipts], timeout=120)
            return [nd.member.memory_view() for nd in nodes[1:]], recs, gen

    views, recs, gen = trio.run(main)
    assert gen.tokens == local_generate(gguf_model, [3, 1, 4, 1, 5], 4)
    assert recs and all(r.status == VALID_S for r in recs.values()), {k.hex()[:8]: v.status for k, v in recs.items()}
    assert sum(v["streamed"] for v in views) >= 2 * len(recs)  # each receipt's two votes ran block by block
    assert all(v["over_budget"] == 0 for v in views)
