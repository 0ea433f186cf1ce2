"""The deterministic outer step of a collaborative training run (pure, numpy float32).

DiLoCo (Douillard et al., arXiv 2311.08105, Algorithm 1; OpenDiLoCo, arXiv 2407.07852): after H inner steps
every worker sends ``Δ_k = θ_r − θ_k``; their average is treated as a gradient by an outer SGD with Nesterov
momentum, ``θ_{r+1} = θ_r − lr · (g + μ·buf)``. Tally adds robustness and makes the step a consensus object:

1. Deltas are taken in canonical order (sorted by worker account bytes); a delta with the wrong tensor count,
   shapes or dtype is dropped (``"wrong shape"`` / ``"wrong dtype"``), one with a NaN or ±inf is dropped
   (``"non-finite"``).
2. ``norm_k = sqrt(Σ_tensors np.sum(d.astype(float64)**2))`` (numpy pairwise summation of each flattened tensor,
   tensors added left to right in Python float64); ``m`` = lower median of the kept norms;
   ``scale_k = float32(min(1, clip_mult·m / norm_k))`` (1 when ``norm_k = 0``); ``d_k ← d_k * scale_k``.
   Median clipping bounds what one poisoned or ×100 delta can do while honest deltas of similar size pass
   unchanged (a norm-clipping robust aggregator, cf. centered clipping, Karimireddy, He & Jaggi, ICML 2021).
3. ``g = (((d_0 + d_1) + d_2) + …) / K`` in float32.
4. ``buf = momentum·μ + g`` (``buf = g`` without previous momentum); ``step = g + buf·μ`` (Nesterov) or ``buf``;
   ``θ' = θ − step·lr``. This is ``torch.optim.SGD(nesterov=True)``'s update written as separate float32 ops.

Every float32 op is a separate, correctly rounded IEEE elementwise operation (no fused multiply-add, no BLAS,
no threads), so any node recomputes ``θ_{r+1}`` bit for bit. The probe measured that even torch's SGD differs
from these explicit ops in the last bits (``shared/notes/diloco-probe.md``): the sequence is the protocol.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

DROP_NON_FINITE = "non-finite"
DROP_SHAPE = "wrong shape"
DROP_DTYPE = "wrong dtype"


@dataclass(frozen=True)
class OuterSpec:
    """Outer optimizer of a run: SGD with (Nesterov) momentum and median-norm clipping.

    ``lr`` (dimensionless multiplier of the mean Δ, > 0), ``momentum`` μ in [0, 1), ``clip_mult`` > 0 (a delta's
    norm is clipped to ``clip_mult ×`` the median norm). ``lr = 1, momentum = 0`` is plain averaging.

    Raises:
        ValueError: a non-finite or out-of-range value.
    """

    lr: float
    momentum: float
    nesterov: bool = True
    clip_mult: float = 2.0

    def __post_init__(self) -> None:
        for name in ("lr", "momentum", "clip_mult"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"outer {name} must be a finite number, got {v!r}")
        if self.lr <= 0:
            raise ValueError(f"outer lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"outer momentum must be in [0, 1), got {self.momentum}")
        if self.clip_mult <= 0:
            raise ValueError(f"clip_mult must be > 0, got {self.clip_mult}")


@dataclass(frozen=True)
class OuterResult:
    """Result of one outer step.

    ``params``: θ_{r+1} (float32, contiguous, θ_r's shapes). ``momentum``: the new outer buffer; ``None`` only
    when the input momentum was ``None`` and no delta was kept (nothing changes, so the next step still takes
    the ``buf = g`` path bit for bit). ``accepted``: worker accounts whose delta was averaged, canonical order.
    ``dropped``: account → reason. ``norms``: account → L2 norm of its delta before clipping (kept deltas).
    ``scales``: account → the float32 clip factor applied (1.0 = not clipped).
    """

    params: list[torch.Tensor]
    momentum: list[torch.Tensor] | None
    accepted: tuple[bytes, ...]
    dropped: dict[bytes, str]
    norms: dict[bytes, float]
    scales: dict[bytes, float] = field(default_factory=dict)


def _flat32(t: object, what: str) -> np.ndarray:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise ValueError(f"{what} must be a float32 torch tensor")
    return t.detach().cpu().contiguous().numpy().reshape(-1)


def _out(a: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float32, copy=True).reshape(shape))


def _why_malformed(d: object, shapes: Sequence[tuple[int, ...]]) -> str | None:
    if not isinstance(d, (list, tuple)) or len(d) != len(shapes):
        return DROP_SHAPE
    for t, s in zip(d, shapes, strict=True):
        if not isinstance(t, torch.Tensor):
            return DROP_DTYPE
        if tuple(t.shape) != s:
            return DROP_SHAPE
        if t.dtype != torch.float32:
            return DROP_DTYPE
    return None


def delta_norm(delta: Sequence[np.ndarray]) -> float:
    """L2 norm of a flattened delta: ``sqrt(Σ_tensors np.sum(d.astype(float64)**2))`` (step 2 of the module)."""
    total = 0.0
    for d in delta:
        total = total + float(np.sum(d.astype(np.float64) ** 2))
    return math.sqrt(total)


def outer_step(params: list[torch.Tensor], momentum: list[torch.Tensor] | None,
               deltas: list[tuple[bytes, list[torch.Tensor]]], spec: OuterSpec) -> OuterResult:
    """One outer step ``θ_r → θ_{r+1}``: the exact sequence of the module docstring.

    Args:
        params: θ_r, float32 tensors in the run's parameter order.
        momentum: the outer buffer after round r−1 (same shapes, float32), or ``None`` before the first step.
        deltas: ``(worker account, Δ tensors)`` pairs in any order; Δ = θ_r − θ_worker (decoded, float32).
        spec: the run's outer optimizer.

    Returns an :class:`OuterResult`; the inputs are never modified. With no kept delta the params (copies) and
    momentum are returned unchanged.

    Raises:
        ValueError: params or momentum are not float32 tensors of matching shapes, a worker account is not
            bytes, or one account appears twice. (Bad deltas are dropped, not raised: they come from peers.)
    """
    if not isinstance(spec, OuterSpec):
        raise ValueError("spec must be an OuterSpec")
    if not isinstance(params, (list, tuple)):
        raise ValueError("params must be a list of tensors")
    shapes = [tuple(p.shape) if isinstance(p, torch.Tensor) else () for p in params]
    theta = [_flat32(p, f"params[{i}]") for i, p in enumerate(params)]
    buf_prev: list[np.ndarray] | None = None
    if momentum is not None:
        if not isinstance(momentum, (list, tuple)) or len(momentum) != len(params) or any(
                not isinstance(m, torch.Tensor) or tuple(m.shape) != s for m, s in zip(momentum, shapes, strict=True)):
            raise ValueError("momentum must be a list of tensors with the shapes of params")
        buf_prev = [_flat32(m, f"momentum[{i}]") for i, m in enumerate(momentum)]

    seen: set[bytes] = set()
    for entry in deltas:
        if not isinstance(entry, tuple) or len(entry) != 2 or not isinstance(entry[0], bytes):
            raise ValueError("each delta must be a (worker account bytes, tensor list) pair")
        if entry[0] in seen:
            raise ValueError(f"worker {entry[0].hex()} appears twice")
        seen.add(entry[0])

    # 1. canonical order; drop malformed and non-finite deltas
    dropped: dict[bytes, str] = {}
    kept: list[tuple[bytes, list[np.ndarray]]] = []
    for worker, tensors in sorted(deltas, key=lambda e: e[0]):
        why = _why_malformed(tensors, shapes)
        if why is None:
            flat = [_flat32(t, "delta") for t in tensors]
            if not all(bool(np.all(np.isfinite(a))) for a in flat):
                why = DROP_NON_FINITE
        if why is not None:
            dropped[worker] = why
            continue
        kept.append((worker, flat))

    if not kept:
        return OuterResult(params=[_out(t, s) for t, s in zip(theta, shapes, strict=True)],
                           momentum=None if buf_prev is None  # None exactly when momentum is
                           else [_out(m, s) for m, s in zip(buf_prev, shapes, strict=True)],
                           accepted=(), dropped=dropped, norms={}, scales={})

    # 2. median-norm clipping
    norms = {w: delta_norm(d) for w, d in kept}
    ordered = sorted(norms.values())
    median = ordered[(len(ordered) - 1) // 2]
    scales: dict[bytes, float] = {}
    clipped: list[list[np.ndarray]] = []
    for w, d in kept:
        n = norms[w]
        s = np.float32(1.0) if n == 0 else np.float32(min(1.0, spec.clip_mult * median / n))
        scales[w] = float(s)
        clipped.append(d if s == np.float32(1.0) else [a * s for a in d])

    # 3. mean, summed left to right in canonical order
    K = np.float32(len(clipped))
    g = []
    for i in range(len(theta)):
        acc = clipped[0][i].copy()
        for d in clipped[1:]:
            acc = acc + d[i]
        g.append(acc / K)

    # 4. (Nesterov) momentum and the step
    mu, lr = np.float32(spec.momentum), np.float32(spec.lr)
    new_theta, new_buf = [], []
    for i, th in enumerate(theta):
        buf = g[i].copy() if buf_prev is None else buf_prev[i] * mu + g[i]
        step = g[i] + buf * mu if spec.nesterov else buf
        new_theta.append(_out(th - step * lr, shapes[i]))
        new_buf.append(_out(buf, shapes[i]))
    return OuterResult(params=new_theta, momentum=new_buf, accepted=tuple(w for w, _ in kept),
                       dropped=dropped, norms=norms, scales=scales)


__all__ = [
    "DROP_DTYPE",
    "DROP_NON_FINITE",
    "DROP_SHAPE",
    "OuterResult",
    "OuterSpec",
    "delta_norm",
    "outer_step",
]
