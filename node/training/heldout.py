"""The held-out loss of a run's parameters after each round (issue 40: "the held-out loss per round as a chart").

The run's dataset is split as for training (:func:`node.compute.train.split_tokens`): the last 10 % of its tokens
are never trained on. The aggregator of a round evaluates θ_{r+1} on the first :data:`HELD_WINDOWS` windows of that
tail and signs the mean loss into its :class:`~node.ledger.core.runtx.RoundAggregate` (``heldout_ppm``: millionths
of a nat per token; 0 when it measured none); the committee that re-computes the aggregate bit for bit measures
the same windows on the same θ and votes the aggregate invalid when the claim is further than
:data:`HELDOUT_TOL_PPM` from its own (:func:`heldout_agrees`). So the per-round curve the API and the explorer show
is checked, not just reported.

CPU float32 forwards are bit-identical only at the same thread count and batch shape (a different machine may
differ in the last bits), so the check is a tolerance: 1e-3 nats per token, two orders of magnitude above the
float32 noise of a mean over 8 × seq_len tokens and below any change a round makes that a chart would show.
The loss is computed on the executor (torch); nothing here reads data from a peer but the dataset, which the
run's ``dataset_root`` fixes.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..compute.train import encode_text, split_tokens
from ..ledger.core.runtx import RunPost
from .assign import make_windows
from .inner import InnerTrainer

HELD_WINDOWS = 8  # windows of the held-out tail evaluated per round (bounds its time: one forward of 8 windows)
HELDOUT_TOL_PPM = 1_000  # |claimed − measured| allowed, millionths of a nat per token
MAX_HELDOUT_PPM = 10**9  # a claim above 1,000 nats per token is no measurement (refused as malformed)


def _held(held_ids: torch.Tensor, seq_len: int) -> torch.Tensor | None:
    try:
        return make_windows(held_ids, seq_len)[:HELD_WINDOWS]
    except ValueError:  # the tail is shorter than one window
        return None


def heldout_windows(model_dir: Path, post: RunPost, text: bytes) -> torch.Tensor | None:
    """The run's held-out windows: int64 ``(≤ HELD_WINDOWS, seq_len + 1)`` from the last 10 % of the dataset's
    tokens, or None when that tail is shorter than one window."""
    _, held_ids = split_tokens(encode_text(model_dir, text))
    return _held(held_ids, post.seq_len)


def run_data(model_dir: Path, post: RunPost, text: bytes) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The run's training windows (as :func:`node.training.rounds.run_windows`) and its held-out windows (as
    :func:`heldout_windows`), from one tokenization of the dataset (a node loading a run needs both)."""
    train_ids, held_ids = split_tokens(encode_text(model_dir, text))
    return make_windows(train_ids, post.seq_len), _held(held_ids, post.seq_len)


def heldout_loss_ppm(trainer: InnerTrainer, theta: list[torch.Tensor], held: torch.Tensor | None) -> int:
    """Mean next-token loss of ``theta`` on ``held``, in millionths of a nat per token (rounded; at least 1 so
    that 0 keeps meaning "not measured"), or 0 when there are no held-out windows or the loss is not finite.
    The trainer's own parameters are restored afterwards (it is the node's cached trainer of the run).

    Raises:
        ValueError: ``theta`` does not fit the trainer (count, shape or dtype).
    """
    if held is None or not held.shape[0]:
        return 0
    before = trainer.params()
    trainer.load_params(theta)
    try:
        loss = trainer.eval_loss(held)
    finally:
        trainer.load_params(before)
    if not math.isfinite(loss) or loss * 1e6 >= MAX_HELDOUT_PPM:
        return 0
    return max(1, round(loss * 1e6))


def heldout_agrees(claimed_ppm: int, measured_ppm: int) -> bool:
    """Whether an aggregate's claimed held-out loss matches a committee member's measurement: an aggregate that
    claims none (0) agrees with anything (the field is optional); otherwise both within :data:`HELDOUT_TOL_PPM`."""
    if claimed_ppm == 0:
        return True
    return measured_ppm != 0 and abs(claimed_ppm - measured_ppm) <= HELDOUT_TOL_PPM


__all__ = ["HELDOUT_TOL_PPM", "HELD_WINDOWS", "heldout_agrees", "heldout_loss_ppm", "heldout_windows", "run_data"]
