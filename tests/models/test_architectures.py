"""Check 1 of issue 15: every supported architecture, added with ``node model add`` from a tiny random
``save_pretrained`` checkpoint, decodes through 3 spans + the client head to exactly the tokens of the untouched
transformers model in one process, and a LoRA segment on it trains and is voted VALID by committee replay."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from node.compute.head import ClientHead
from node.compute.reference import load_causal_lm, local_generate
from node.compute.span import SpanModel
from node.compute.train import Trainer, encode_text, split_tokens
from node.encoding import commitments_root
from node.ledger.core.jobtx import JobPost, TrainReceipt
from node.ledger.core.tx import INVALID, VALID
from node.market.check import TRAIN_TOLERANCE, replay_segment
from node.market.worker import spec_of

from .conftest import ARCHS, DESIGN

STEPS = 8  # greedy tokens; prompt 5 + 8 positions > the sliding window of 4
SPANS = [(0, 1), (1, 3), (3, 4)]


def chain_generate(spans, head, prompt_ids, n):
    """Greedy ``n`` tokens: prefill, then one token at a time through every span's own KV cache."""
    caches = [s.new_cache() for s in spans]
    step, out = torch.tensor([prompt_ids]), []
    for _ in range(n):
        h = head.embed(step)
        for s, c in zip(spans, caches, strict=True):
            h = s.forward(h, c)
        out.append(head.next_token(h))
        step = torch.tensor([[out[-1]]])
    return out


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_three_spans_equal_the_transformers_model(model_type, checkpoints, added):
    from transformers import AutoModelForCausalLM

    model_dir = added[1][model_type]
    head = ClientHead(model_dir)
    prompt = head.tokenizer.encode("The committee re-executes a sampled receipt")[:5]
    assert len(prompt) == 5
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoints[model_type]), dtype=torch.float32,
                                              trust_remote_code=False).eval()
    ref = local_generate(model_dir, prompt, STEPS, model=hf)  # the original checkpoint, transformers' forward
    spans = [SpanModel(model_dir, a, b) for a, b in SPANS]
    assert chain_generate(spans, head, prompt, STEPS) == ref
    assert len(set(ref)) > 2, ref  # not a degenerate model: positions and inputs matter
    # the converted dir rebuilt as one model (what training and committees load) gives the same logits
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        torch.testing.assert_close(load_causal_lm(model_dir)(input_ids=ids).logits, hf(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)
    # a span's incremental decoding equals one prefill of the same inputs (the committee's re-execution)
    h = head.embed(torch.tensor([prompt + ref[:3]]))
    c = spans[1].new_cache()
    inc = torch.cat([spans[1].forward(h[:, :5], c), *(spans[1].forward(h[:, i:i + 1], c) for i in range(5, 8))],
                    dim=1)
    torch.testing.assert_close(inc, spans[1].prefill(h), rtol=1e-4, atol=1e-4 * float(inc.abs().max()))


def test_sliding_window_layers_keep_their_kind_per_block(added):
    """Gemma's block 1 is global, blocks 0 and 2 slide: a span [1, 3) keeps that order and is not batched."""
    span = SpanModel(added[1]["gemma3_text"], 1, 3)
    assert span.config.layer_types == ["full_attention", "sliding_attention"]
    assert [layer.self_attn.sliding_window for layer in span.net.layers] == [None, 4]
    assert span.batchable is False
    assert SpanModel(added[1]["qwen2"], 0, 2).batchable is True


def _post(**kw):
    base = dict(chain_id="c", sender=b"r" * 32, job_id=b"j" * 16, title="t", model_id=b"m" * 32,
                dataset_root=b"d" * 32, rank=4, targets="q_proj,v_proj", steps=2, batch_size=2, seq_len=16,
                lr_micro=10_000, seed=3, segment_steps=2, price_per_step=1, deadline=100, sample_ppm=0, nonce=0)
    return JobPost(**{**base, **kw})


def _segment(model_dir, p, text):
    """A worker's honest first segment: (receipt, state before, state after, losses)."""
    t = Trainer(model_dir, spec_of(p))
    s0 = t.state_tensors()
    ids, _ = split_tokens(encode_text(model_dir, text))
    losses, batches = t.train_steps(ids, 0, p.segment_steps)
    s1 = t.state_tensors()
    r = TrainReceipt("c", p.job_id, b"w" * 32, p.sender, 0, p.segment_steps, commitments_root(s0),
                     commitments_root(s1), commitments_root(batches), 1, 4)
    return r, s0, s1, losses


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_lora_segment_trains_and_committee_votes_valid(model_type, added):
    model_dir = added[1][model_type]
    text = DESIGN.read_bytes()
    p = _post()
    r, s0, s1, losses = _segment(model_dir, p, text)
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert r.state_after != r.state_before  # the adapter moved
    verdict, d = replay_segment(model_dir, p, text, r, s0, s1)
    assert verdict == VALID and d < TRAIN_TOLERANCE / 10


def test_fabricated_adapter_on_gemma3_is_invalid(added):
    """The committee is no rubber stamp on a non-Llama architecture: a perturbed adapter is voted INVALID."""
    model_dir = added[1]["gemma3_text"]
    text = DESIGN.read_bytes()
    p = _post()
    r, s0, s1, _ = _segment(model_dir, p, text)
    fake = [x.clone() for x in s1]
    fake[0] = fake[0] + 0.05 * (fake[0].std() + 1e-3)
    verdict, d = replay_segment(model_dir, p, text, replace(r, state_after=commitments_root(fake)), s0, fake)
    assert verdict == INVALID and d > TRAIN_TOLERANCE * 5
