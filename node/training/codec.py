"""Pseudo-gradient codecs of a collaborative training run (pure, deterministic, numpy float32).

A worker's pseudo-gradient is ``Δ = θ_r − θ_worker``: one float32 tensor per trainable parameter, in the run's
parameter order. Before upload it is encoded with the run's codec; the payload is a tensor list whose id
(``node.encoding.commitments_root``) the round receipt commits to as ``delta_root``, so a committee recomputes
``encode`` from the replayed state and compares ids.

* ``none``: the float32 Δ itself (4 bytes per parameter).
* ``int8``: per-tensor absmax quantization, round to nearest (half to even), 1 byte per parameter plus one
  float32 scale per tensor -- the INT8 pseudo-gradients of OpenDiLoCo / INTELLECT-1 (Jaghouar et al., arXiv
  2407.07852 and 2412.01152), measured here to change the held-out loss by < 3e-5 nats
  (``shared/notes/diloco-probe.md``).
* ``topk``: the ``k`` entries of largest magnitude per tensor, with error feedback: what is not sent is kept in a
  local residual and added to the next round's Δ, so nothing is lost, only delayed (DeMo, Peng et al., arXiv
  2411.19870; SparseLoCo, "Communication-efficient LLM pre-training with SparseLoCo", 2025; the classic
  error-feedback analysis of Karimireddy et al., "Error Feedback Fixes SignSGD", arXiv 1901.09847).

Every operation is elementwise IEEE float32 (or an exact max / selection), so results are bit-identical across
processes, thread counts and machines. No pickle; payloads travel as plain tensors (``node.encoding``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import numpy as np
import torch

PPM = 1_000_000
INT8_LEVELS = 127  # codes are in [-127, 127]; -128 is never produced and is refused by decode


class Codec(str, Enum):
    """A run's pseudo-gradient codec (the run parameter ``codec``)."""

    NONE = "none"
    INT8 = "int8"
    TOPK = "topk"


def topk_k(n: int, topk_ppm: int) -> int:
    """Entries kept of a tensor of ``n`` elements: ``max(1, ceil(n · topk_ppm / 10^6))``, at most ``n``.

    Integer arithmetic (exact). A tensor with no elements keeps 0.
    """
    if n <= 0:
        return 0
    return min(n, max(1, (n * topk_ppm + PPM - 1) // PPM))


def _flat32(t: object, what: str) -> np.ndarray:
    """A float32 torch tensor as a flat, read-only numpy view (no copy)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise ValueError(f"{what} must be a float32 torch tensor, got "
                         f"{getattr(t, 'dtype', type(t).__name__)}")
    a = t.detach().cpu().contiguous().numpy().reshape(-1)
    a.flags.writeable = False
    return a


def _to_torch(a: np.ndarray, shape: Sequence[int]) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).reshape(tuple(shape)))


def _int8_encode(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [n], s float32 [1]) of a flat float32 vector."""
    n = d.size
    if n and not np.all(np.isfinite(d)):
        # A non-finite Δ (a diverged worker or the NaN cheat) stays detectable: scale NaN, codes 0, so the
        # decoded tensor is all NaN and the outer step drops it as "non-finite".
        return np.zeros(n, np.int8), np.array([np.nan], np.float32)
    absmax = np.max(np.abs(d)) if n else np.float32(0)
    s = np.float32(absmax) / np.float32(INT8_LEVELS)
    if s == 0:  # an all-zero tensor (or one whose absmax/127 underflows float32)
        return np.zeros(n, np.int8), np.array([0.0], np.float32)
    q = np.clip(np.rint(d / s), -INT8_LEVELS, INT8_LEVELS).astype(np.int8)
    return q, np.array([s], np.float32)


def _topk_select(e: np.ndarray, k: int) -> np.ndarray:
    """Ascending int64 indices of the ``k`` largest ``|e|`` (NaN counts as +inf), ties to the lower index.

    O(n): the k-th largest key by partition, then every key above it and the first keys equal to it.
    """
    n = e.size
    if k == 0:
        return np.zeros(0, np.int64)
    key = np.abs(e)
    key[np.isnan(key)] = np.inf
    kth = np.partition(key, n - k)[n - k]
    above = np.flatnonzero(key > kth)
    equal = np.flatnonzero(key == kth)[: k - above.size]
    return np.sort(np.concatenate([above, equal]))


def encode(delta: list[torch.Tensor], codec: Codec, residual: list[torch.Tensor] | None = None,
           topk_ppm: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Encode a pseudo-gradient. Returns ``(payload tensor list, new residual)``.

    Args:
        delta: float32 tensors, one per trainable parameter (``Δ = θ_r − θ_worker``, parameter units).
        codec: the run's codec.
        residual: the error-feedback residual from the previous round, same shapes, float32; ``None`` = zeros.
        topk_ppm: for ``topk``, the kept fraction in parts per million (1 .. 10^6); ignored otherwise.

    Payload layout:
        * ``NONE``: ``[Δ_0, Δ_1, ...]`` float32, same shapes; residual returned unchanged.
        * ``INT8``: per tensor ``[q (int8, same shape), s (float32, shape [1])]`` with ``s = max|d| / 127`` and
          ``q = clamp(round_half_even(d / s), -127, 127)``; ``|d − s·q| ≤ s/2`` up to float32 rounding of the
          division and of the decode product. An all-zero tensor has ``s = 0, q = 0``; a tensor with a
          non-finite value has ``s = NaN, q = 0`` (decodes to NaN, so the outer step drops it). Residual
          returned unchanged.
        * ``TOPK``: ``e = Δ + residual``; per tensor ``[idx (int32, [k], strictly ascending), val (float32, [k])]``
          with the ``k = topk_k(n, topk_ppm)`` entries of largest ``|e|`` (NaN ranks as +inf; ties to the lower
          index); new residual ``= e − decoded`` (exactly 0 at the sent indices).

    Raises:
        ValueError: a tensor that is not float32, a residual of another length or shape, an unknown codec, or
            ``topk_ppm`` outside 1 .. 10^6 for ``topk``. Nothing is modified in place.
    """
    codec = Codec(codec)
    if not isinstance(delta, (list, tuple)):
        raise ValueError("delta must be a list of tensors")
    ds = [_flat32(t, f"delta[{i}]") for i, t in enumerate(delta)]
    shapes = [tuple(t.shape) for t in delta]
    if residual is None:
        res = [np.zeros(d.size, np.float32) for d in ds]
    else:
        if not isinstance(residual, (list, tuple)) or len(residual) != len(delta):
            raise ValueError(f"residual must be a list of {len(delta)} tensors")
        for i, (rt, shape) in enumerate(zip(residual, shapes, strict=True)):
            if not isinstance(rt, torch.Tensor) or tuple(rt.shape) != shape:
                raise ValueError(f"residual[{i}] must have shape {shape}")
        res = [_flat32(r, f"residual[{i}]") for i, r in enumerate(residual)]

    if codec is Codec.TOPK:
        if isinstance(topk_ppm, bool) or not isinstance(topk_ppm, int) or not 1 <= topk_ppm <= PPM:
            raise ValueError(f"topk_ppm must be an integer in 1..{PPM}, got {topk_ppm!r}")
        payload: list[torch.Tensor] = []
        new_res: list[torch.Tensor] = []
        for d, r, shape in zip(ds, res, shapes, strict=True):
            e = d + r
            idx = _topk_select(e, topk_k(e.size, topk_ppm))
            val = e[idx]
            dec = np.zeros(e.size, np.float32)
            dec[idx] = val
            payload += [torch.from_numpy(idx.astype(np.int32)), torch.from_numpy(np.ascontiguousarray(val))]
            new_res.append(_to_torch(e - dec, shape))
        return payload, new_res

    kept = [_to_torch(r.copy(), shape) for r, shape in zip(res, shapes, strict=True)]
    if codec is Codec.NONE:
        return [_to_torch(d.copy(), shape) for d, shape in zip(ds, shapes, strict=True)], kept
    payload = []
    for d, shape in zip(ds, shapes, strict=True):
        q, s = _int8_encode(d)
        payload += [_to_torch(q, shape), torch.from_numpy(s)]
    return payload, kept


def _check_shapes(shapes: object) -> list[tuple[int, ...]]:
    if not isinstance(shapes, (list, tuple)):
        raise ValueError("shapes must be a list of tuples")
    out = []
    for s in shapes:
        if not isinstance(s, (list, tuple, torch.Size)) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s):
            raise ValueError(f"bad shape {s!r}")
        out.append(tuple(s))
    return out


def _expect(t: object, dtype: torch.dtype, shape: tuple[int, ...] | None, what: str) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{what}: expected {dtype}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{what}: expected shape {shape}, got {tuple(t.shape)}")
    return t.detach().cpu().contiguous().numpy().reshape(-1)


def decode(payload: list[torch.Tensor], codec: Codec, shapes: list[tuple[int, ...]],
           topk_ppm: int | None = None) -> list[torch.Tensor]:
    """Decode a payload (possibly from a peer) into float32 tensors of ``shapes`` (new, contiguous tensors).

    ``topk_ppm`` (optional, ``topk`` only): also require exactly ``topk_k(n, topk_ppm)`` entries per tensor,
    so a worker cannot send more than the run allows.

    Non-finite values are *not* malformed: they decode to non-finite floats, which the outer step drops with
    the reason ``"non-finite"``.

    Raises:
        ValueError: a malformed payload -- wrong tensor count, dtype or shape; an int8 code of -128 or a
            negative scale; top-k indices out of range, not strictly ascending, or a wrong count.
    """
    codec = Codec(codec)
    shapes = _check_shapes(shapes)
    if not isinstance(payload, (list, tuple)):
        raise ValueError("payload must be a list of tensors")
    per = 1 if codec is Codec.NONE else 2
    if len(payload) != per * len(shapes):
        raise ValueError(f"{codec.value} payload for {len(shapes)} tensors has {per * len(shapes)} tensors, "
                         f"got {len(payload)}")
    out: list[torch.Tensor] = []
    for i, shape in enumerate(shapes):
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if codec is Codec.NONE:
            out.append(_to_torch(_expect(payload[i], torch.float32, shape, f"tensor {i}").copy(), shape))
        elif codec is Codec.INT8:
            q = _expect(payload[2 * i], torch.int8, shape, f"tensor {i} codes")
            s = _expect(payload[2 * i + 1], torch.float32, (1,), f"tensor {i} scale")
            if q.size and int(q.min()) < -INT8_LEVELS:
                raise ValueError(f"tensor {i}: int8 code -128 is outside -127..127")
            if s[0] < 0:
                raise ValueError(f"tensor {i}: negative int8 scale {float(s[0])}")
            out.append(_to_torch(q.astype(np.float32) * s[0], shape))
        else:
            idx = _expect(payload[2 * i], torch.int32, None, f"tensor {i} indices")
            val = _expect(payload[2 * i + 1], torch.float32, None, f"tensor {i} values")
            if payload[2 * i].dim() != 1 or payload[2 * i + 1].dim() != 1 or idx.size != val.size:
                raise ValueError(f"tensor {i}: indices and values must be 1-D of one length")
            want = topk_k(n, topk_ppm) if topk_ppm is not None else None
            if (want is not None and idx.size != want) or idx.size > n:
                raise ValueError(f"tensor {i}: {idx.size} top-k entries, expected "
                                 f"{want if want is not None else f'at most {n}'}")
            if idx.size and (int(idx[0]) < 0 or int(idx[-1]) >= n or not np.all(idx[1:] > idx[:-1])):
                raise ValueError(f"tensor {i}: top-k indices must be strictly ascending in 0..{n - 1}")
            dec = np.zeros(n, np.float32)
            dec[idx.astype(np.int64)] = val
            out.append(_to_torch(dec, shape))
    return out


def payload_bytes(payload: Sequence[torch.Tensor]) -> int:
    """Raw tensor bytes of a payload (what a worker uploads, before framing): Σ numel · element size."""
    return sum(t.numel() * t.element_size() for t in payload)


__all__ = ["INT8_LEVELS", "PPM", "Codec", "decode", "encode", "payload_bytes", "topk_k"]
