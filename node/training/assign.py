"""Beacon-drawn, disjoint batch assignment for the rounds of a collaborative training run (pure).

The run's training tokens are cut into non-overlapping windows of ``seq_len + 1`` tokens (:func:`make_windows`,
the same windows as ``Trainer.eval_loss``). In round r the windows are permuted by a seed
``H(b"tally/run-batches/v1" ‖ beacon ‖ run_id ‖ round)`` that no worker can predict or choose (the beacon is a
block hash finalized after the round opened, as for receipt sampling, ``node.ledger.core.sampling``): windows are
sorted by ``H(seed ‖ index)``. Worker j (workers sorted by account bytes) takes the j-th consecutive chunk of
``inner_steps · batch_size + screen_windows`` windows: its H training batches, then its held-out screen windows
(``node.training.screen``). Chunks are disjoint, so no two workers train on the same window in a round, and a
worker cannot steer its data toward a poisoned or memorised slice.

Integers enter hashes as fixed-width big-endian (round: 4 bytes, window index: 8 bytes); beacon and run id are
32 bytes, so the concatenation is unambiguous.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..encoding import HASH_LEN, H, commitments_root

BATCHES_TAG = b"tally/run-batches/v1"


def make_windows(train_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The training tokens as int64 windows ``(n, seq_len + 1)``, ``n = len // (seq_len + 1)``, non-overlapping
    and in order (window i is tokens ``[i·(seq_len+1), (i+1)·(seq_len+1))``); a trailing partial window is left out.

    Raises:
        ValueError: ``train_ids`` is not a 1-D integer tensor, ``seq_len < 1``, or fewer than ``seq_len + 1`` tokens.
    """
    if not isinstance(train_ids, torch.Tensor) or train_ids.dim() != 1 or train_ids.dtype.is_floating_point \
            or train_ids.dtype == torch.bool:
        raise ValueError("train_ids must be a 1-D integer tensor of token ids")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1, got {seq_len!r}")
    L = seq_len + 1
    n = len(train_ids) // L
    if n < 1:
        raise ValueError(f"dataset too short: {len(train_ids)} tokens for one window of {L}")
    return train_ids[: n * L].to(torch.int64).reshape(n, L).contiguous()


@dataclass(frozen=True)
class Assignment:
    """One worker's windows in one round: ``batches`` = H tuples of ``batch_size`` window indices (trained, in
    step order); ``screen`` = held-out window indices of the same draw (never trained on)."""

    batches: tuple[tuple[int, ...], ...]
    screen: tuple[int, ...]


def _nonneg_int(v: object, name: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return v


def round_seed(beacon: bytes, run_id: bytes, round_: int) -> bytes:
    """``H(b"tally/run-batches/v1" ‖ beacon ‖ run_id ‖ round as 4 bytes big-endian)``; 32 bytes.

    Raises:
        ValueError: beacon or run id not 32 bytes, or a round outside ``0 .. 2^32 − 1``.
    """
    for name, v in (("beacon", beacon), ("run_id", run_id)):
        if not isinstance(v, bytes) or len(v) != HASH_LEN:
            raise ValueError(f"{name} must be {HASH_LEN} bytes")
    if isinstance(round_, bool) or not isinstance(round_, int) or not 0 <= round_ < 1 << 32:
        raise ValueError(f"round must be an integer in 0..2^32-1, got {round_!r}")
    return H(BATCHES_TAG, beacon, run_id, round_.to_bytes(4, "big"))


def window_order(seed: bytes, n_windows: int) -> list[int]:
    """The round's permutation of ``range(n_windows)``: indices sorted by ``H(seed ‖ index as 8 bytes)``."""
    return sorted(range(n_windows), key=lambda i: H(seed, i.to_bytes(8, "big")))


def assign_round(beacon: bytes, run_id: bytes, round_: int, workers: Sequence[bytes], n_windows: int,
                 inner_steps: int, batch_size: int, screen_windows: int) -> dict[bytes, Assignment]:
    """Each worker's :class:`Assignment` for round ``round_`` (see the module docstring).

    Args:
        beacon: the round's 32-byte beacon. run_id: the run's 32-byte id. round_: the round number (>= 0).
        workers: the round's worker accounts (any order; sorted here). n_windows: windows in the dataset.
        inner_steps: H (>= 1). batch_size: windows per inner step (>= 1). screen_windows: held-out windows per
            worker (>= 0).

    Returns ``{account: Assignment}``; the same inputs always give the same result.

    Raises:
        ValueError: bad argument types or ranges, duplicate workers, or ``K · chunk > n_windows`` (the dataset is
            too small for this many workers at these settings).
    """
    seed = round_seed(beacon, run_id, round_)
    _nonneg_int(n_windows, "n_windows")
    h = _nonneg_int(inner_steps, "inner_steps", 1)
    b = _nonneg_int(batch_size, "batch_size", 1)
    sw = _nonneg_int(screen_windows, "screen_windows")
    if not all(isinstance(w, bytes) and w for w in workers):
        raise ValueError("workers must be non-empty account bytes")
    ordered = sorted(workers)
    if len(set(ordered)) != len(ordered):
        raise ValueError("duplicate worker in the round")
    chunk = h * b + sw
    if len(ordered) * chunk > n_windows:
        raise ValueError(f"dataset too small: {len(ordered)} workers × {chunk} windows (H={h} × batch {b} + "
                         f"{sw} screen) = {len(ordered) * chunk} > {n_windows} windows")
    if not ordered:
        return {}
    perm = window_order(seed, n_windows)
    out: dict[bytes, Assignment] = {}
    for j, w in enumerate(ordered):
        mine = perm[j * chunk:(j + 1) * chunk]
        batches = tuple(tuple(mine[s * b:(s + 1) * b]) for s in range(h))
        out[w] = Assignment(batches=batches, screen=tuple(mine[h * b:]))
    return out


def _gather(windows: torch.Tensor, idx: Sequence[int]) -> torch.Tensor:
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.dtype != torch.int64:
        raise ValueError("windows must be an int64 (n, seq_len + 1) tensor")
    n = windows.shape[0]
    if any(not 0 <= i < n for i in idx):
        raise ValueError(f"window index out of range 0..{n - 1}")
    return windows[list(idx)].contiguous()


def batch_tensors(windows: torch.Tensor, assignment: Assignment) -> list[torch.Tensor]:
    """The H training batches of an assignment: int64 ``(batch_size, seq_len + 1)`` each, in step order.

    Raises:
        ValueError: ``windows`` is not int64 2-D, or an index is out of range.
    """
    return [_gather(windows, batch) for batch in assignment.batches]


def screen_tensor(windows: torch.Tensor, assignment: Assignment) -> torch.Tensor:
    """The held-out screen windows of an assignment: int64 ``(screen_windows, seq_len + 1)``.

    Raises:
        ValueError: as :func:`batch_tensors`.
    """
    return _gather(windows, assignment.screen)


def batches_root(windows: torch.Tensor, assignment: Assignment) -> bytes:
    """``commitments_root`` of the H batch tensors (what a round receipt commits to as ``batches_root``).

    Raises:
        ValueError: as :func:`batch_tensors`.
    """
    return commitments_root(batch_tensors(windows, assignment))


__all__ = [
    "BATCHES_TAG",
    "Assignment",
    "assign_round",
    "batch_tensors",
    "batches_root",
    "make_windows",
    "round_seed",
    "screen_tensor",
    "window_order",
]
