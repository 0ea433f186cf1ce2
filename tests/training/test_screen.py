"""The loss screen: a good Δ passes; sign-flipped, ×100 and NaN Δs fail -- on a quadratic and on the tiny Llama
trained for a few real AdamW steps."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.func import functional_call

from node.compute.model import make_tiny
from node.compute.reference import load_causal_lm
from node.training.screen import apply_delta, screen


def _quadratic(target):
    def loss(ps):
        return float(sum(((p.double() - t.double()) ** 2).sum() for p, t in zip(ps, target, strict=True)))
    return loss


g = torch.Generator().manual_seed(0)
TARGET = [torch.randn(6, 4, generator=g), torch.randn(9, generator=g)]
THETA = [torch.randn(6, 4, generator=g), torch.randn(9, generator=g)]
GRAD_STEP = [(p - t) for p, t in zip(THETA, TARGET, strict=True)]  # Δ = c·(θ − θ*) moves θ − Δ toward θ* for 0 < c < 2


@settings(max_examples=40, deadline=None)
@given(st.floats(0.05, 1.9))
def test_quadratic_good_step_passes(c):
    before, after, ok = screen(_quadratic(TARGET), THETA, [d * c for d in GRAD_STEP], tol=0.0)
    assert ok and after < before
    assert after == pytest.approx((1 - c) ** 2 * before, rel=1e-4, abs=1e-5 * before)  # float32 θ − Δ


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.floats(-100.0, -0.05), st.floats(2.1, 100.0)))
def test_quadratic_bad_step_fails(c):
    before, after, ok = screen(_quadratic(TARGET), THETA, [d * c for d in GRAD_STEP], tol=0.0)
    assert not ok and after > before


def test_tolerance_and_non_finite():
    loss = _quadratic(TARGET)
    tiny_up = [d * 2.001 for d in GRAD_STEP]  # raises the loss by a hair
    before, after, ok = screen(loss, THETA, tiny_up, tol=0.0)
    assert not ok and 0 < after - before < 0.01 * before
    assert screen(loss, THETA, tiny_up, tol=0.01 * before)[2]
    nan = [d.clone() for d in GRAD_STEP]
    nan[1][0] = float("nan")
    assert screen(loss, THETA, nan, tol=1e9)[2] is False
    assert screen(loss, THETA, [d * 0 for d in GRAD_STEP], tol=0.0)[2]  # a free rider passes the screen
    for bad_tol in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            screen(loss, THETA, GRAD_STEP, tol=bad_tol)
    with pytest.raises(ValueError):
        screen(loss, THETA, GRAD_STEP[:1], tol=0.0)
    with pytest.raises(ValueError):
        apply_delta(THETA, [GRAD_STEP[0].double(), GRAD_STEP[1]])


@pytest.fixture
def one_thread():
    """Tiny-model forward passes are 10-30× faster on one thread when other processes share the 2 cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_round(tmp_path, one_thread):
    """θ_r = the tiny Llama's parameters; a worker trains 12 AdamW steps on windows of a repeating token pattern;
    the screen windows are other windows of the same text. Returns (loss_fn, θ_r, Δ)."""
    model = load_causal_lm(make_tiny(tmp_path, seed=0))
    names = sorted(n for n, _ in model.named_parameters())
    theta = [dict(model.named_parameters())[n].detach().clone() for n in names]
    pattern = torch.tensor([5, 17, 42, 99, 7, 250, 3, 64, 128, 11, 300, 21])
    ids = pattern.repeat(60)
    windows = ids[: 40 * 17].reshape(40, 17)
    train, held = windows[:32], windows[32:36]

    def loss_on(ps, x):
        logits = functional_call(model, dict(zip(names, ps, strict=True)), (x[:, :-1],), {"use_cache": False}).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

    def loss_fn(ps):
        with torch.no_grad():
            return float(loss_on(ps, held))

    model.train()
    ps = [t.clone().requires_grad_(True) for t in theta]
    opt = torch.optim.AdamW(ps, lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for step in range(12):
        opt.zero_grad()
        loss_on(ps, train[(step * 4) % 32:(step * 4) % 32 + 4]).backward()
        opt.step()
    model.eval()
    delta = [(t - p.detach()).contiguous() for t, p in zip(theta, ps, strict=True)]
    return loss_fn, theta, delta


def test_tiny_llama_honest_delta_passes_cheats_fail(tiny_round):
    loss_fn, theta, delta = tiny_round
    before, after, ok = screen(loss_fn, theta, delta, tol=0.0)
    assert ok and after < before - 0.1  # a real improvement on held-out windows
    b2, flipped, ok_flip = screen(loss_fn, theta, [-d for d in delta], tol=0.05)
    assert b2 == before and not ok_flip and flipped > before
    _, scaled, ok_scaled = screen(loss_fn, theta, [d * 100 for d in delta], tol=0.05)
    assert not ok_scaled and (not math.isfinite(scaled) or scaled > before)
    nan = [d.clone() for d in delta]
    nan[0].view(-1)[0] = float("nan")
    assert screen(loss_fn, theta, nan, tol=1e9)[2] is False
