"""Spans, client head and the single-process reference on the tiny random model."""

from __future__ import annotations

import pytest
import torch

from node.compute.head import ClientHead
from node.compute.model import load_manifest
from node.compute.reference import load_causal_lm, local_generate
from node.compute.span import SpanModel

PROMPT = [5, 17, 99, 3, 250]
STEPS = 8


def chain_generate(spans, head, prompt, steps, log=None):
    """Prefill ``prompt`` through ``spans`` then ``steps`` single-token steps; returns steps + 1 new tokens.

    ``log`` (dict span -> list of (input, output)) records every call, for the prefill comparison.
    """
    caches = [s.new_cache() for s in spans]
    h = head.embed(torch.tensor([prompt]))
    tokens = []
    for _ in range(steps + 1):
        for s, c in zip(spans, caches, strict=True):
            out = s.forward(h, c)
            if log is not None:
                log.setdefault(s, []).append((h, out))
            h = out
        tokens.append(head.next_token(h))
        h = head.embed(torch.tensor([[tokens[-1]]]))
    return tokens


@pytest.fixture(scope="module")
def spans(tiny_dir):
    return [SpanModel(tiny_dir, 0, 2), SpanModel(tiny_dir, 2, 4), SpanModel(tiny_dir, 4, 6)]


@pytest.fixture(scope="module")
def head(tiny_dir):
    return ClientHead(tiny_dir)


def test_chain_matches_local_generate(tiny_dir, spans, head):
    ref = local_generate(tiny_dir, PROMPT, STEPS + 1)
    got = chain_generate(spans, head, PROMPT, STEPS)
    assert got == ref
    assert len(set(ref)) > 3  # the tiny model is not degenerate: the test can tell positions apart


def test_other_split_and_full_span_agree(tiny_dir, head):
    ref = local_generate(tiny_dir, PROMPT, STEPS + 1)
    assert chain_generate([SpanModel(tiny_dir, 0, 6)], head, PROMPT, STEPS) == ref
    assert chain_generate([SpanModel(tiny_dir, 0, 1), SpanModel(tiny_dir, 1, 6)], head, PROMPT, STEPS) == ref


def test_incremental_equals_prefill(spans, head):
    """Outputs of prefill + single-token steps equal one prefill of all inputs (rtol 1e-4 of the output scale).

    Elementwise relative error is meaningless for entries near zero, so the tolerance is rtol 1e-4 plus an
    absolute 1e-4 x max|output|; both the scale-relative and the worst elementwise relative errors are printed.
    """
    log = {}
    chain_generate(spans, head, PROMPT, STEPS, log)
    worst_scaled = worst_elem = 0.0
    for s in spans:
        calls = log[s]
        assert [x.shape[1] for x, _ in calls] == [5] + [1] * STEPS
        inputs = torch.cat([x for x, _ in calls], dim=1)
        incremental = torch.cat([y for _, y in calls], dim=1)
        once = s.prefill(inputs)
        assert once.shape == incremental.shape == (1, 5 + STEPS, 64)
        scale = float(once.abs().max())
        torch.testing.assert_close(incremental, once, rtol=1e-4, atol=1e-4 * scale)
        diff = (incremental - once).abs()
        worst_scaled = max(worst_scaled, float(diff.max()) / scale)
        worst_elem = max(worst_elem, float((diff / once.abs()).max()))
    print(f"incremental vs prefill: max |diff|/max|out| {worst_scaled:.2e}, max elementwise rel {worst_elem:.2e}")
    assert worst_scaled < 1e-4


def test_reference_model_matches_spans(tiny_dir, spans, head):
    full = load_causal_lm(tiny_dir)
    ids = torch.tensor([PROMPT])
    h = head.embed(ids)
    for s in spans:
        h = s.prefill(h)
    with torch.inference_mode():
        want = full(input_ids=ids).logits
    torch.testing.assert_close(head.logits(h), want, rtol=1e-4, atol=1e-4)
    assert local_generate(tiny_dir, PROMPT, 3, model=full) == local_generate(tiny_dir, PROMPT, 3)


def test_batch_and_independent_sessions(tiny_dir, spans):
    s = spans[1]
    x = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(1))
    both = s.forward(x, s.new_cache())
    assert both.shape == (2, 4, 64) and both.dtype == torch.float32
    assert not both.is_inference() and both.is_contiguous()
    torch.testing.assert_close(both[1:], s.prefill(x[1:]), rtol=1e-4, atol=1e-5)
    # two sessions interleaved on one span do not disturb each other
    c1, c2 = s.new_cache(), s.new_cache()
    a1 = s.forward(x[:1, :2], c1)
    s.forward(x[1:, :3], c2)
    a2 = s.forward(x[:1, 2:], c1)
    torch.testing.assert_close(torch.cat([a1, a2], 1), s.prefill(x[:1]), rtol=1e-4, atol=1e-5)
    assert c1.get_seq_length() == 4 and c2.get_seq_length() == 3


def test_span_attributes_and_errors(tiny_dir, spans):
    s = spans[2]
    m = load_manifest(tiny_dir)
    assert (s.start, s.end, s.model_id, s.hidden_size, s.max_length) == (4, 6, m.model_id, 64, 256)
    assert len(s.net.layers) == 2
    for a, b in ((0, 0), (3, 2), (-1, 2), (5, 7)):
        with pytest.raises(ValueError):
            SpanModel(tiny_dir, a, b)
    with pytest.raises(ValueError):
        SpanModel(tiny_dir, 0, 1, fault="lie")
    c = s.new_cache()
    with pytest.raises(ValueError):
        s.forward(torch.zeros(1, 2, 63), c)
    with pytest.raises(ValueError):
        s.forward(torch.zeros(1, 2, 64, dtype=torch.float64), c)
    with pytest.raises(ValueError):
        s.forward(torch.zeros(2, 64), c)
    with pytest.raises(ValueError, match="max_length"):
        s.forward(torch.zeros(1, 257, 64), c)
    s.forward(torch.zeros(1, 250, 64), c)
    with pytest.raises(ValueError, match="max_length"):
        s.forward(torch.zeros(1, 7, 64), c)
    assert c.get_seq_length() == 250
    with pytest.raises(ValueError, match="batch"):
        s.forward(torch.zeros(2, 1, 64), c)


def test_corrupt_fault(tiny_dir, spans):
    honest = spans[1]
    bad = SpanModel(tiny_dir, 2, 4, fault="corrupt")
    x = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(2))
    good_out = honest.forward(x, honest.new_cache())
    bad_out = bad.forward(x, bad.new_cache())
    rel = float((bad_out - good_out).norm() / good_out.norm())
    assert 0.2 < rel < 1.0, rel  # ~0.5 x the output's std
    # deterministic: another cheater with the same inputs lies identically
    torch.testing.assert_close(SpanModel(tiny_dir, 2, 4, fault="corrupt").forward(x, bad.new_cache()), bad_out)
    # re-execution (prefill) is honest
    torch.testing.assert_close(bad.prefill(x), honest.prefill(x), rtol=1e-4, atol=1e-5)


def test_client_head(tiny_dir, head):
    assert head.tokenizer is None
    ids = torch.tensor([[1, 2, 3]])
    e = head.embed(ids)
    assert e.shape == (1, 3, 64) and torch.equal(e[0, 1], head.embed_weight[2])
    lg = head.logits(e)
    assert lg.shape == (1, 3, 320)
    assert head.next_token(e) == int(lg[0, -1].argmax())
    with pytest.raises(ValueError):
        head.embed(torch.tensor([[320]]))
    with pytest.raises(ValueError):
        head.embed(torch.tensor([1, 2]))
    with pytest.raises(ValueError):
        head.next_token(torch.zeros(2, 1, 64))
    with pytest.raises(ValueError):
        head.logits(torch.zeros(1, 1, 10))


def test_local_generate_errors(tiny_dir):
    with pytest.raises(ValueError):
        local_generate(tiny_dir, [], 3)
    with pytest.raises(ValueError):
        local_generate(tiny_dir, [999], 3)
    with pytest.raises(ValueError):
        local_generate(tiny_dir, [1] * 250, 10)
    assert local_generate(tiny_dir, [1, 2], 0) == []
