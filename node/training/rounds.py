"""One round of a run in torch: train it (a worker), replay it (a committee), aggregate it (the aggregator).

Blocking functions for the node's torch executor (never the event loop). Everything a replay needs is named by
the ledger (:mod:`node.ledger.core.runs`) and fetched by content hash; these functions take the tensors themselves.

* :func:`train_round` — load θ_r and the inner state, train the H assigned batches, encode
  Δ = θ_r − θ_worker with the run's codec (:mod:`node.training.codec`), return what the receipt commits to.
* :func:`replay_round` — the committee's check of a round receipt: the committed start state is θ_r and the
  expected inner state, the batches are the beacon's, H replayed steps land within :data:`ROUND_TOLERANCE` of
  the committed θ_worker and moments, and the committed Δ is exactly the codec's encoding of
  θ_r − θ_worker (elementwise float32: bit-identical on any CPU).
* :func:`aggregate_round` — screen each revealed Δ (:mod:`node.training.screen`) and take the outer step
  (:mod:`node.training.outer`) over the ones that pass.

``fault`` (devnet and test chains only) makes a worker cheat, one kind per name in :data:`RUN_FAULTS`
(:mod:`node.training.faults`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..compute.train import encode_text, mean_loss_ppm, split_tokens, state_distance
from ..encoding import H, commitments_root
from ..ledger.core.runtx import RunPost
from ..ledger.core.tx import INVALID, VALID
from .assign import Assignment, assign_round, make_windows
from .codec import Codec, decode, encode, payload_bytes
from .faults import RUN_FAULTS as RUN_FAULTS  # the worker's switches, carried out by train_round
from .inner import InnerTrainer
from .outer import OuterResult, OuterSpec, outer_step
from .screen import screen

# worst relative L2 distance of an honest replay (weights and moments): measured 8.5e-5 across thread counts 1 vs 2
# on SmolLM2 LoRA (shared/notes/diloco-probe.md) and 0 at equal thread counts; 1e-3 leaves 10x headroom while
# a skipped step or other data moves the state by > 1e-2 (tests/training/test_rounds.py measures both)
ROUND_TOLERANCE = 1e-3
# an honest Δ applied alone may raise the loss on its worker's few screen windows a little (measured: +0.08 and
# +0.21 nats from 8.3-8.6 on the tiny random model at lr 1e-2; bench/training.py saw 12-16 of 36 honest Δs above
# +0 nats on the scratch model), while sign flips and x100 scaling raise it by 35 % to 400 % (tests/training):
# pass iff after <= before * (1 + SCREEN_REL) + SCREEN_TOL
SCREEN_REL = 0.05
SCREEN_TOL = 0.02
# the run-codec cheat's codec: another than the run's, one a cheater would gain from (more precision, or none lost)
OTHER_CODEC = {Codec.NONE: Codec.INT8, Codec.INT8: Codec.NONE, Codec.TOPK: Codec.NONE, Codec.TOPK_INT4: Codec.TOPK}


def run_key(run_id: bytes) -> bytes:
    """The 32-byte key of a run for batch assignment (``run_id`` on the ledger is 16 bytes)."""
    return H(b"tally/run/v1", run_id)


def outer_spec(post: RunPost) -> OuterSpec:
    return OuterSpec(lr=post.outer_lr_ppm / 1e6, momentum=post.outer_momentum_ppm / 1e6,
                     nesterov=bool(post.nesterov), clip_mult=post.clip_ppm / 1e6)


def make_trainer(model_dir: Path, post: RunPost | dict[str, Any], device: str = "cpu") -> InnerTrainer:
    """The run's :class:`InnerTrainer` (θ_0 of a LoRA run is its seeded init; of an ``all`` run the model's).

    ``post``: a :class:`RunPost`, or a mapping of its fields (a sponsor's settings before the post exists).
    Target names are stripped as :func:`node.ledger.core.jobtx.parse_targets` reads them on the ledger."""
    get = post.__getitem__ if isinstance(post, dict) else post.__getattribute__
    trainable = get("trainable")
    targets = tuple(t.strip() for t in get("targets").split(",") if t.strip()) if trainable == "lora" else ()
    return InnerTrainer(Path(model_dir), trainable, get("rank"), targets, get("lr_micro") / 1e6, get("seed"), device)


def run_windows(model_dir: Path, post: RunPost, text: bytes) -> torch.Tensor:
    """The run's training windows: int64 ``(n, seq_len + 1)`` of the first 90 % of the dataset's tokens."""
    train_ids, _ = split_tokens(encode_text(model_dir, text))
    return make_windows(train_ids, post.seq_len)


def assignment(post: RunPost, beacon: bytes, round_: int, participants: Iterable[bytes], n_windows: int,
               worker: bytes) -> Assignment:
    """``worker``'s batches and screen windows in this round attempt.

    Raises:
        ValueError: the dataset is too small for the round's workers, or ``worker`` is not a participant.
    """
    got = assign_round(beacon, run_key(post.run_id), round_, list(participants), n_windows, post.inner_steps,
                       post.batch_size, post.screen_windows)
    if worker not in got:
        raise ValueError("not a participant of this round")
    return got[worker]


def zero_opt(trainer: InnerTrainer) -> list[torch.Tensor]:
    """The inner state of a worker's first round: zero moments, zero residual, step 0."""
    trainer.reset_opt_state()
    trainer.set_residuals([torch.zeros(s, dtype=torch.float32) for s in trainer.shapes])
    return trainer.opt_state()


def reset_of(trainer: InnerTrainer, prev: list[torch.Tensor]) -> list[torch.Tensor]:
    """Under ``inner_state = reset``: ``prev``'s residual with zero moments and step 0."""
    trainer.load_opt_state(prev)
    trainer.reset_opt_state()
    return trainer.opt_state()


@dataclass
class RoundWork:
    """What a worker commits to: θ_worker, the inner state after, the encoded Δ, its mean loss and byte size."""

    params_after: list[torch.Tensor]
    opt_after: list[torch.Tensor]
    payload: list[torch.Tensor]
    loss_ppm: int
    delta_bytes: int


def train_round(trainer: InnerTrainer, post: RunPost, theta: list[torch.Tensor], opt_before: list[torch.Tensor],
                batches: list[torch.Tensor], fault: str | None = None, stale: list[torch.Tensor] | None = None,
                old_payload: list[torch.Tensor] | None = None, other: list[torch.Tensor] | None = None) -> RoundWork:
    """Train one round from θ_r (``theta``) and ``opt_before`` on the H ``batches`` and encode Δ.

    Cheats (``fault``): ``run-zero`` commits θ_r itself (a free rider); ``run-scale`` / ``run-flip`` / ``run-nan``
    send 100·Δ / −Δ / NaN; ``run-fewer`` trains H − 1 steps; ``run-otherdata`` trains on ``other`` batches;
    ``run-stale`` trains from ``stale`` (θ of an earlier round); ``run-replay`` sends ``old_payload`` (its Δ of
    an earlier round); ``run-codec`` sends Δ encoded with another codec than the run's (:data:`OTHER_CODEC`),
    its committed state the run codec's; ``run-residual`` encodes from a residual other than the one its
    ``opt_before`` commits to (that residual plus Δ: its update pushed twice) and commits the residual that
    encoding leaves. Each still commits the honest receipt fields it can, as a cheater would.
    """
    start = stale if fault == "run-stale" and stale is not None else theta
    trainer.load_params(start)
    trainer.load_opt_state(opt_before)
    used = other if fault == "run-otherdata" and other is not None else batches
    if fault == "run-fewer":
        used = used[:-1]
    if fault == "run-zero":
        losses, after = [], [t.clone() for t in theta]
    else:
        losses, after = trainer.train(used), trainer.params()
    delta = [(a - b).contiguous() for a, b in zip(theta, after, strict=True)]
    if fault == "run-scale":
        delta = [d * 100 for d in delta]
    elif fault == "run-flip":
        delta = [-d for d in delta]
    elif fault == "run-nan":
        delta = [torch.full_like(d, float("nan")) for d in delta]
    codec, carried = Codec(post.codec), trainer.residuals()
    if fault == "run-residual":
        carried = [r + d for r, d in zip(carried, delta, strict=True)]
    payload, residual = encode(delta, codec, carried, post.topk_ppm)
    if fault == "run-replay" and old_payload is not None:
        payload = old_payload
    elif fault == "run-codec":
        payload = encode(delta, OTHER_CODEC[codec], trainer.residuals(), post.topk_ppm)[0]
    trainer.set_residuals(residual)
    loss = mean_loss_ppm(losses) if losses else 4_000_000  # a free rider reports a plausible loss
    return RoundWork(after, trainer.opt_state(), payload, loss, payload_bytes(payload))


def expected_opt_before(trainer: InnerTrainer, post: RunPost, prev: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """What a worker's ``opt_before`` must be: zeros in its first round; else its previous ``opt_after`` (keep)
    or that with zero moments and step (reset)."""
    if prev is None:
        return zero_opt(trainer)
    return [t.clone() for t in prev] if post.inner_state == "keep" else reset_of(trainer, prev)


def replay_round(trainer: InnerTrainer, post: RunPost, theta: list[torch.Tensor], opt_before: list[torch.Tensor],
                 expected_before: list[torch.Tensor], batches: list[torch.Tensor], batches_root: bytes,
                 params_after: list[torch.Tensor], opt_after: list[torch.Tensor], payload: list[torch.Tensor],
                 delta_bytes: int) -> tuple[int, float, str]:
    """A committee member's verdict on a round receipt: ``(VALID | INVALID, distance, reason)``.

    ``expected_before``: :func:`expected_opt_before` of the worker's previous committed state. Distance: the
    worst relative L2 difference of the replayed θ_worker and moments from the committed ones
    (:func:`node.compute.train.state_distance`); ``inf`` for a structural mismatch.
    """
    n = len(trainer.names)
    if commitments_root(batches) != batches_root:
        return INVALID, math.inf, "batches are not the round's assignment"
    if len(opt_before) != len(expected_before) or any(
            a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b)
            for a, b in zip(opt_before, expected_before, strict=True)):
        return INVALID, math.inf, "opt_before is not the state this worker had to start from"
    try:
        trainer.load_params(theta)
        trainer.load_opt_state(opt_before)
        trainer.load_params(params_after)  # shape checks of the committed tensors
        trainer.load_opt_state(opt_after)
    except ValueError as e:
        return INVALID, math.inf, f"committed tensors malformed: {e}"
    trainer.load_params(theta)
    trainer.load_opt_state(opt_before)
    trainer.train(batches)
    replayed_params, replayed_opt = trainer.params(), trainer.opt_state()
    d = max(state_distance(params_after, replayed_params),
            state_distance(opt_after[:2 * n] + opt_after[-1:], replayed_opt[:2 * n] + replayed_opt[-1:]))
    if not d <= ROUND_TOLERANCE:
        return INVALID, d, "the replayed steps do not reach the committed state"
    delta = [(a - b).contiguous() for a, b in zip(theta, params_after, strict=True)]
    want, residual = encode(delta, Codec(post.codec), opt_before[2 * n:3 * n], post.topk_ppm)
    if commitments_root(want) != commitments_root(payload) or payload_bytes(want) != delta_bytes:
        return INVALID, d, "the committed Δ is not θ_r − θ_worker encoded with the run's codec"
    if any(not torch.equal(a, b) for a, b in zip(residual, opt_after[2 * n:3 * n], strict=True)):
        return INVALID, d, "the committed codec residual is not the encoding's"
    return VALID, d, "ok"


def screen_losses(trainer: InnerTrainer, theta: list[torch.Tensor], delta: list[torch.Tensor],
                  windows: torch.Tensor) -> tuple[float, float, bool]:
    """:func:`node.training.screen.screen` of one Δ on its worker's screen ``windows`` (int64 (n, seq_len+1))."""
    def loss(params: list[torch.Tensor]) -> float:
        trainer.load_params(params)
        return trainer.eval_loss(windows)
    before = loss(theta)
    tol = SCREEN_TOL + SCREEN_REL * before if math.isfinite(before) else 0.0
    return screen(loss, theta, delta, tol)


def aggregate_round(trainer: InnerTrainer, post: RunPost, theta: list[torch.Tensor],
                    momentum: list[torch.Tensor] | None, payloads: dict[bytes, list[torch.Tensor]],
                    screens: dict[bytes, torch.Tensor]) -> tuple[OuterResult, dict[bytes, str]]:
    """The aggregator's outer step: decode each revealed Δ (malformed → excluded), screen it on its worker's
    windows (``screens``; a worker without screen windows is not screened), and take the outer step over the
    rest. Returns the :class:`OuterResult` (over the screened-in Δs) and ``{worker: reason}`` of the excluded."""
    excluded: dict[bytes, str] = {}
    deltas: list[tuple[bytes, list[torch.Tensor]]] = []
    for w in sorted(payloads):
        try:
            d = decode(payloads[w], Codec(post.codec), trainer.shapes,
                       post.topk_ppm if Codec(post.codec).sparse else None)
        except ValueError as e:
            excluded[w] = f"malformed Δ: {e}"
            continue
        if not all(bool(torch.isfinite(t).all()) for t in d):
            excluded[w] = "non-finite"
            continue
        win = screens.get(w)
        if win is not None and win.shape[0]:
            before, after, ok = screen_losses(trainer, theta, d, win)
            if not ok:
                excluded[w] = f"screen: loss {before:.4f} -> {after:.4f}"
                continue
        deltas.append((w, d))
    res = outer_step(theta, momentum, deltas, outer_spec(post))
    excluded.update(res.dropped)
    return res, excluded


def recompute_outer(trainer: InnerTrainer, post: RunPost, theta: list[torch.Tensor],
                    momentum: list[torch.Tensor] | None, payloads: dict[bytes, list[torch.Tensor]]) -> OuterResult:
    """The outer step over exactly the accepted workers' Δs (what a committee and every worker re-compute)."""
    deltas = []
    for w in sorted(payloads):
        try:
            deltas.append((w, decode(payloads[w], Codec(post.codec), trainer.shapes,
                                     post.topk_ppm if Codec(post.codec).sparse else None)))
        except ValueError:
            continue  # a malformed Δ cannot be in an honest aggregate: the ids will differ
    return outer_step(theta, momentum, deltas, outer_spec(post))

