"""The cheap loss screen of one pseudo-gradient (pure but for the caller's loss function).

Before a worker's Δ enters the outer step it is applied alone to the round's global parameters and evaluated on
that worker's own held-out screen windows (drawn with its batches by ``node.training.assign`` but never trained
on): an update that raises the loss there is excluded. This is the loss-improvement check Templar's validators
run on miners' updates (tplr-ai/templar, "Templar Incentive Mechanism", loss-based gradient evaluation:
``L_before − L_after`` on the miner's own deterministic data assignment). It is cheap (two forward passes) and catches
sign-flipped, scaled-up, NaN and other-data updates without a full replay; a free rider (Δ = 0) passes it and is left to
replay and payment rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def apply_delta(params: list[torch.Tensor], delta: list[torch.Tensor]) -> list[torch.Tensor]:
    """``θ − Δ`` elementwise in float32 (new tensors; inputs untouched).

    Raises:
        ValueError: lists of different lengths, or a tensor pair of different shape or dtype.
    """
    if not isinstance(params, (list, tuple)) or not isinstance(delta, (list, tuple)) or len(params) != len(delta):
        raise ValueError("params and delta must be tensor lists of one length")
    out = []
    for i, (p, d) in enumerate(zip(params, delta, strict=True)):
        if not isinstance(p, torch.Tensor) or not isinstance(d, torch.Tensor):
            raise ValueError(f"tensor {i}: expected torch tensors")
        if p.shape != d.shape or p.dtype != d.dtype:
            raise ValueError(f"tensor {i}: params {tuple(p.shape)} {p.dtype} vs delta {tuple(d.shape)} {d.dtype}")
        out.append((p.detach() - d.detach()).contiguous())
    return out


def screen(loss_fn: Callable[[list[torch.Tensor]], float], params: list[torch.Tensor], delta: list[torch.Tensor],
           tol: float) -> tuple[float, float, bool]:
    """Screen one Δ: ``(before, after, passed)``.

    ``before = loss_fn(θ_r)``, ``after = loss_fn(θ_r − Δ)`` (mean loss on the worker's screen windows, nats per
    token); ``passed`` iff ``after`` is finite and ``after ≤ before + tol``. A non-finite ``before`` (a broken
    θ_r) fails every Δ, since no comparison with NaN holds.

    Args:
        loss_fn: maps a parameter list (the run's order) to a mean loss; called exactly twice.
        params: θ_r. delta: the decoded Δ, same shapes and dtype. tol: allowed increase, nats (finite, >= 0).

    Raises:
        ValueError: a negative or non-finite ``tol``, or mismatched params and delta (see :func:`apply_delta`).
    """
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    moved = apply_delta(params, delta)
    before = float(loss_fn(list(params)))
    after = float(loss_fn(moved))
    passed = math.isfinite(after) and after <= before + tol
    return before, after, passed


__all__ = ["apply_delta", "screen"]
