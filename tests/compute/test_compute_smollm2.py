"""The real model: GGUF conversion and a 3-span route equal to a single-process run (slow, ~1 min)."""

from __future__ import annotations

import resource
import time

import pytest
import torch

from node.compute.head import ClientHead
from node.compute.model import ensure_smollm2, load_manifest
from node.compute.reference import local_generate
from node.compute.span import SpanModel

from .test_compute_span import chain_generate


@pytest.mark.slow
def test_smollm2_route_matches_local(tmp_path):
    t0 = time.perf_counter()
    d = ensure_smollm2(tmp_path, progress=True)
    t_convert = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert ensure_smollm2(tmp_path) == d
    t_again = time.perf_counter() - t0
    m = load_manifest(d)
    assert (m.num_blocks, m.hidden_size, m.vocab_size, m.max_length) == (30, 576, 49152, 8192)
    assert d.name == "smollm2-135m" and (tmp_path / ".smollm2.lock").exists()

    head = ClientHead(d)
    prompt = head.tokenizer("The capital of France is")["input_ids"]
    assert prompt == [504, 3575, 282, 4649, 314]  # same ids as the GGUF's own tokenizer

    t0 = time.perf_counter()
    ref = local_generate(d, prompt, 8)
    t_local = time.perf_counter() - t0

    t0 = time.perf_counter()
    spans = [SpanModel(d, 0, 10), SpanModel(d, 10, 20), SpanModel(d, 20, 30)]
    t_spans_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = chain_generate(spans, head, prompt, 7)  # prefill + 7 steps = 8 tokens
    t_chain = time.perf_counter() - t0
    assert got == ref and len(ref) == 8
    text = head.tokenizer.decode(ref)
    print(
        f"\nsmollm2: convert {t_convert:.1f}s, 2nd ensure {t_again * 1e3:.2f}ms, local_generate(load+8 tok) "
        f"{t_local:.2f}s, 3 spans load {t_spans_load:.2f}s, chain 8 tok {t_chain:.2f}s "
        f"({8 / t_chain:.1f} tok/s), threads {torch.get_num_threads()}, "
        f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
        f"output {text!r}"
    )
    assert "Paris" in text
