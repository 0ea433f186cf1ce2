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
* ``topk-int4``: ``topk``'s indices, with the kept values quantized to 4 bits (per-tensor absmax, codes in
  -7..7, two codes per byte) and the quantization error fed back too: the residual is ``e − decoded``, so what the
  rounding lost is sent in later rounds like what the selection left out. This is SparseLoCo's recipe (Sarfi,
  Thérien, Lidin, Belilovsky, "Communication Efficient LLM Pre-training with SparseLoCo", arXiv 2508.15706: top-k
  of an error-feedback accumulator, values quantized to 2 bits). Four bits rather than two because an index here
  is an int32 (4 bytes): a kept entry costs 4.5 bytes at 4 bits and 4.25 at 2 bits (6 % less), while symmetric
  2-bit absmax codes (-1, 0, 1) would zero every kept value under half the tensor's largest, paying the index to
  send nothing; SparseLoCo's 2 bits pay off with its chunk-local indices (12 bits), which this layout does not have.

Every operation is elementwise IEEE float32 (or an exact max / selection / integer bit packing), so results are
bit-identical across processes, thread counts and machines. No pickle; payloads travel as plain tensors
(``node.encoding``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import numpy as np
import torch

PPM = 1_000_000
INT8_LEVELS = 127  # codes are in [-127, 127]; -128 is never produced and is refused by decode
INT4_LEVELS = 7  # topk-int4 codes q are in [-7, 7], stored as the nibble q + 8 (1..15); nibble 0 only pads


class Codec(str, Enum):
    """A run's pseudo-gradient codec (the run parameter ``codec``)."""

    NONE = "none"
    INT8 = "int8"
    TOPK = "topk"
    TOPK_INT4 = "topk-int4"

    @property
    def sparse(self) -> bool:
        """True for the top-k codecs: their payloads carry ``topk_k(n, topk_ppm)`` entries per tensor."""
        return self in (Codec.TOPK, Codec.TOPK_INT4)


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


def _int4_encode(val: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(packed uint8 [ceil(k/2)], s float32 [1], decoded float32 [k])`` of the ``k`` kept values.

    ``s = max|val| / 7``, ``q = clamp(round_half_even(val / s), -7, 7)``, decoded ``= q · s``; the nibble of
    value ``j`` is ``q_j + 8``, in the low half of byte ``j // 2`` for even ``j``, the high half for odd ``j``; an
    odd ``k`` pads the last high nibble with 0. Zero values (or an underflowing scale): ``s = 0, q = 0``; a
    non-finite value: ``s = NaN, q = 0`` (decodes to NaN: the outer step drops it, as ``int8``'s).
    """
    k = val.size
    q = np.zeros(k, np.int8)
    if k and not np.all(np.isfinite(val)):
        s = np.float32(np.nan)
    else:
        s = np.float32(np.max(np.abs(val)) if k else 0) / np.float32(INT4_LEVELS)
        if s != 0:
            q = np.clip(np.rint(val / s), -INT4_LEVELS, INT4_LEVELS).astype(np.int8)
    nib = np.zeros(k + k % 2, np.uint8)
    nib[:k] = (q + 8).astype(np.uint8)
    packed = (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)
    return packed, np.array([s], np.float32), q.astype(np.float32) * s


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
        topk_ppm: for ``topk`` and ``topk-int4``, the kept fraction in parts per million (1 .. 10^6); ignored
            otherwise.

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
        * ``TOPK_INT4``: per tensor ``[idx (as TOPK), codes (uint8, [ceil(k/2)]), s (float32, [1])]``, the kept
          values of ``e`` quantized by 4-bit absmax (:func:`_int4_encode`: ``|v − q·s| ≤ s/2`` up to float32
          rounding); new residual ``= e − decoded``. At a sent index that subtraction is exact whenever ``s`` is a
          normal float32 (Sterbenz: for ``q ≠ 0``, ``q·s`` is within a factor 2 of ``v``), so ``decoded +
          residual == e`` exactly and only forming ``e = Δ + residual`` rounds.

    Raises:
        ValueError: a tensor that is not float32, a residual of another length or shape, an unknown codec, or
            ``topk_ppm`` outside 1 .. 10^6 for a top-k codec. Nothing is modified in place.
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

    if codec.sparse:
        if isinstance(topk_ppm, bool) or not isinstance(topk_ppm, int) or not 1 <= topk_ppm <= PPM:
            raise ValueError(f"topk_ppm must be an integer in 1..{PPM}, got {topk_ppm!r}")
        payload: list[torch.Tensor] = []
        new_res: list[torch.Tensor] = []
        for d, r, shape in zip(ds, res, shapes, strict=True):
            e = d + r
            idx = _topk_select(e, topk_k(e.size, topk_ppm))
            val = e[idx]
            if codec is Codec.TOPK:
                sent, parts = val, [torch.from_numpy(np.ascontiguousarray(val))]
            else:
                codes, scale, sent = _int4_encode(val)
                parts = [torch.from_numpy(codes), torch.from_numpy(scale)]
            dec = np.zeros(e.size, np.float32)
            dec[idx] = sent
            payload += [torch.from_numpy(idx.astype(np.int32)), *parts]
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


def _topk_indices(t: object, i: int, n: int, want: int | None) -> np.ndarray:
    """A top-k payload's indices of tensor ``i`` (``n`` elements): int32, 1-D, strictly ascending in ``0..n-1``,
    ``want`` of them (or at most ``n`` when ``want`` is None)."""
    idx = _expect(t, torch.int32, None, f"tensor {i} indices")
    if not isinstance(t, torch.Tensor) or t.dim() != 1:
        raise ValueError(f"tensor {i}: indices must be 1-D")
    if (want is not None and idx.size != want) or idx.size > n:
        raise ValueError(f"tensor {i}: {idx.size} top-k entries, expected "
                         f"{want if want is not None else f'at most {n}'}")
    if idx.size and (int(idx[0]) < 0 or int(idx[-1]) >= n or not np.all(idx[1:] > idx[:-1])):
        raise ValueError(f"tensor {i}: top-k indices must be strictly ascending in 0..{n - 1}")
    return idx.astype(np.int64)


def _int4_decode(codes_t: object, scale_t: object, i: int, k: int) -> np.ndarray:
    """The ``k`` float32 values of a ``topk-int4`` tensor ``i`` (layout: :func:`_int4_encode`)."""
    codes = _expect(codes_t, torch.uint8, ((k + 1) // 2,), f"tensor {i} codes")
    s = _expect(scale_t, torch.float32, (1,), f"tensor {i} scale")
    nib = np.empty(codes.size * 2, np.uint8)
    nib[0::2], nib[1::2] = codes & 15, codes >> 4
    if k and int(nib[:k].min()) == 0:
        raise ValueError(f"tensor {i}: int4 nibble 0 is outside 1..15")
    if nib.size > k and nib[k] != 0:
        raise ValueError(f"tensor {i}: int4 padding nibble must be 0")
    if s[0] < 0:
        raise ValueError(f"tensor {i}: negative int4 scale {float(s[0])}")
    out: np.ndarray = (nib[:k].astype(np.int8) - 8).astype(np.float32) * s[0]
    return out


def _decode_one(payload: Sequence[torch.Tensor], codec: Codec, i: int, shape: tuple[int, ...],
                topk_ppm: int | None) -> torch.Tensor:
    """Tensor ``i`` of a payload (checked as :func:`decode` documents)."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if codec is Codec.NONE:
        return _to_torch(_expect(payload[i], torch.float32, shape, f"tensor {i}").copy(), shape)
    if codec is Codec.INT8:
        q = _expect(payload[2 * i], torch.int8, shape, f"tensor {i} codes")
        s = _expect(payload[2 * i + 1], torch.float32, (1,), f"tensor {i} scale")
        if q.size and int(q.min()) < -INT8_LEVELS:
            raise ValueError(f"tensor {i}: int8 code -128 is outside -127..127")
        if s[0] < 0:
            raise ValueError(f"tensor {i}: negative int8 scale {float(s[0])}")
        return _to_torch(q.astype(np.float32) * s[0], shape)
    want = topk_k(n, topk_ppm) if topk_ppm is not None else None
    if codec is Codec.TOPK:
        idx = _topk_indices(payload[2 * i], i, n, want)
        val = _expect(payload[2 * i + 1], torch.float32, (idx.size,), f"tensor {i} values")
    else:
        idx = _topk_indices(payload[3 * i], i, n, want)
        val = _int4_decode(payload[3 * i + 1], payload[3 * i + 2], i, idx.size)
    dec = np.zeros(n, np.float32)
    dec[idx] = val
    return _to_torch(dec, shape)


PER_TENSOR = {Codec.NONE: 1, Codec.INT8: 2, Codec.TOPK: 2, Codec.TOPK_INT4: 3}  # payload tensors per parameter


def decode(payload: list[torch.Tensor], codec: Codec, shapes: list[tuple[int, ...]],
           topk_ppm: int | None = None) -> list[torch.Tensor]:
    """Decode a payload (possibly from a peer) into float32 tensors of ``shapes`` (new, contiguous tensors).

    ``topk_ppm`` (optional, top-k codecs only): also require exactly ``topk_k(n, topk_ppm)`` entries per
    tensor, so a worker cannot send more than the run allows.

    Non-finite values are *not* malformed: they decode to non-finite floats, which the outer step drops with
    the reason ``"non-finite"``.

    Raises:
        ValueError: a malformed payload -- wrong tensor count, dtype or shape; an int8 code of -128 or a
            negative scale; top-k indices out of range, not strictly ascending, or a wrong count; top-k values
            of another length than the indices; ``topk-int4`` codes of another length than ``ceil(k/2)``, a
            nibble 0 among the codes, a non-zero padding nibble or a negative scale.
    """
    codec = Codec(codec)
    shapes = _check_shapes(shapes)
    if not isinstance(payload, (list, tuple)):
        raise ValueError("payload must be a list of tensors")
    per = PER_TENSOR[codec]
    if len(payload) != per * len(shapes):
        raise ValueError(f"{codec.value} payload for {len(shapes)} tensors has {per * len(shapes)} tensors, "
                         f"got {len(payload)}")
    return [_decode_one(payload, codec, i, shape, topk_ppm) for i, shape in enumerate(shapes)]


def payload_bytes(payload: Sequence[torch.Tensor]) -> int:
    """Raw tensor bytes of a payload (what a worker uploads, before framing): Σ numel · element size."""
    return sum(t.numel() * t.element_size() for t in payload)


__all__ = ["INT4_LEVELS", "INT8_LEVELS", "PER_TENSOR", "PPM", "Codec", "decode", "encode", "payload_bytes", "topk_k"]
