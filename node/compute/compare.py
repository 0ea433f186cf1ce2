"""Comparing committed outputs with a committee's re-execution (pure).

Metric: the worst per-token relative L2 error, ``max_t ‖y_t − ŷ_t‖₂ / (‖ŷ_t‖₂ + ε)`` over every token
position ``t`` of hidden states ``(batch, tokens, hidden)``. A per-token maximum (not a mean over the
session) means a cheat confined to a few positions — NaN in one of eight, half the tokens skipped — cannot hide
inside an average. Non-finite values anywhere make the distance infinite.

The tolerance is the largest honest distance measured (incremental decoding with a KV cache versus one
prefill, thread counts 1 and 2) times a safety margin; see ``tests/verify/test_compare.py`` for the
measurement. Distances travel in votes as integers in parts per million.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEFAULT_TOLERANCE = 1e-3  # relative L2 per token; honest CPU float32 noise measured ~1e-6
EPS = 1e-6


def distance(committed: torch.Tensor, recomputed: torch.Tensor) -> float:
    """Worst per-token relative L2 error between two ``(batch, tokens, hidden)`` tensors.

    Returns ``inf`` when shapes differ or any value is NaN/inf.
    """
    # local: torch takes ~2 s to import; the committee and the API import this module without comparing anything
    import torch

    if committed.shape != recomputed.shape:
        return math.inf
    a, b = committed.double(), recomputed.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    if a.numel() == 0:
        return 0.0
    err = (a - b).norm(dim=-1) / (b.norm(dim=-1) + EPS)
    return float(err.max())


def to_ppm(d: float) -> int:
    """Distance in integer parts per million, saturated at 2^31 − 1 (inf included)."""
    if not math.isfinite(d):
        return 2**31 - 1
    return min(2**31 - 1, round(d * 1e6))


def is_valid(d: float, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    return math.isfinite(d) and d <= tolerance
