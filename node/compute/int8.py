"""Weight-only int8 weights at run time: the quantization scheme, and loading an int8 block into a span.

Scheme: symmetric, per output channel (one scale per row of the ``(out, in)`` weight), as in LLM.int8()'s
vector-wise quantization (Dettmers et al. 2022, arXiv:2208.07339) without its outlier decomposition::

    scale[o] = max_i |W[o, i]| / 127          (1.0 for an all-zero row)
    q[o, i]  = clamp(round(W[o, i] / scale[o]), -127, 127)   int8
    W'[o, i] = float32(q[o, i]) * scale[o]

What is quantized: every 2-D ``*.weight`` of a decoder block — the linear layers (``q/k/v/o_proj``,
``gate/up/down_proj``). Norms, biases, and the whole head (embedding, final norm, LM head) stay float32. A block
file of an int8 model stores ``<module>.weight`` as int8 and ``<module>.weight_scale`` (float32, ``(out,)``) beside
the float tensors.

At load a span keeps the int8 weights resident and dequantizes one layer's weight per matmul
(:class:`Int8Linear`); :func:`dequantize_block` gives the same float weights for a one-process model
(:func:`node.compute.reference.load_causal_lm`), bit for bit, so both compute identical outputs. Writing the int8
copy of a model dir (``node model add SOURCE --quantize int8``) is :mod:`node.models.quantize`, which builds on this
module.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

INT8 = "int8"
QUANTIZATIONS = (INT8,)
CONFIG_KEY = "tally_quantization"
SCALE_SUFFIX = "_scale"
_QMAX = 127
_SCRATCH = threading.local()  # per thread: one float32 buffer as large as the largest weight dequantized so far


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q int8 (out, in), scale float32 (out,))`` of a float 2-D weight, per the module docstring.

    Raises:
        ValueError: ``w`` is not 2-D floating point or holds NaN/inf.
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"int8 quantization needs a 2-D float weight, got {tuple(w.shape)} {w.dtype}")
    w = w.detach().to(torch.float32)
    if not torch.isfinite(w).all():
        raise ValueError("weight holds NaN or inf")
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / _QMAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``float32(q) * scale[:, None]``: the float weight an int8 model computes with."""
    return q.to(torch.float32) * scale.to(torch.float32)[:, None]


def is_linear_weight(name: str, t: torch.Tensor) -> bool:
    """Whether ``node model add --quantize int8`` quantizes tensor ``name`` of a block: a 2-D float ``*.weight``."""
    return name.endswith(".weight") and t.dim() == 2 and t.is_floating_point()


def quantize_block(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A float block state dict -> its int8 form (linear weights int8 plus ``*.weight_scale``; the rest as is)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if is_linear_weight(name, t):
            out[name], out[name + SCALE_SUFFIX] = quantize_weight(t)
        else:
            out[name] = t.detach().to(torch.float32).contiguous()
    return out


def _check_int8(sd: dict[str, torch.Tensor], what: str) -> list[str]:
    """Names of the int8 weights of a quantized block, each checked to have a float32 ``(out,)`` scale."""
    names = []
    for name, t in sd.items():
        if name.endswith(SCALE_SUFFIX):
            base = name[: -len(SCALE_SUFFIX)]
            if base not in sd or sd[base].dtype != torch.int8:
                raise ValueError(f"{what}: scale {name} has no int8 weight {base}")
            continue
        if t.dtype == torch.int8:
            s = sd.get(name + SCALE_SUFFIX)
            if t.dim() != 2 or s is None or s.dtype != torch.float32 or tuple(s.shape) != (t.shape[0],):
                raise ValueError(f"{what}: int8 weight {name} lacks a float32 scale of shape ({t.shape[0]},)")
            if not torch.isfinite(s).all() or not (s > 0).all():
                raise ValueError(f"{what}: scale of {name} is not finite and positive")
            names.append(name)
        elif not t.is_floating_point():
            raise ValueError(f"{what}: tensor {name} has dtype {t.dtype}")
    if not names:
        raise ValueError(f"{what}: an int8 model's block holds no int8 weight")
    return names


def dequantize_block(sd: dict[str, torch.Tensor], what: str = "block") -> dict[str, torch.Tensor]:
    """A quantized block state dict -> float32 (scales dropped). Raises ValueError for a malformed block."""
    int8 = set(_check_int8(sd, what))
    return {k: (dequantize_weight(t, sd[k + SCALE_SUFFIX]) if k in int8 else t)
            for k, t in sd.items() if not (k.endswith(SCALE_SUFFIX) and k[: -len(SCALE_SUFFIX)] in int8)}


class Int8Linear(nn.Module):
    """``nn.Linear`` with a resident int8 weight (buffer ``weight``) and float32 per-row ``weight_scale``.

    ``forward`` dequantizes the weight into a per-thread float32 scratch buffer (one pass, ``q * scale`` as in
    :func:`dequantize_weight`, so bit for bit the float weights of :func:`dequantize_block`) and calls
    ``F.linear``. The buffer is reused by every layer of the thread: a fresh allocation per matmul cost page
    faults that made SmolLM2 7x slower than float (measured, bench/inference.py --model int8).
    """

    weight: torch.Tensor  # int8 (out_features, in_features), a buffer
    weight_scale: torch.Tensor  # float32 (out_features,), a buffer

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.empty(out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.weight
        if q.device.type != "cpu" or x.dtype != torch.float32:
            return nn.functional.linear(x, dequantize_weight(q, self.weight_scale).to(x.dtype), self.bias)
        buf = getattr(_SCRATCH, "buf", None)
        if buf is None or buf.numel() < q.numel():
            with torch.inference_mode(False):  # an ordinary tensor: writable in and outside inference mode
                buf = _SCRATCH.buf = torch.empty(q.numel(), dtype=torch.float32)
        w = buf[: q.numel()].view(q.shape)
        torch.mul(q, self.weight_scale[:, None], out=w)
        return nn.functional.linear(x, w, self.bias)


def load_block(layer: nn.Module, sd: dict[str, torch.Tensor], quantization: str | None, what: str,
               resident: bool = True) -> None:
    """Assign the checked block state dict ``sd`` to decoder ``layer`` (built on ``meta``).

    Float model (``quantization`` None): ``load_state_dict`` as is. int8 with ``resident``: every ``nn.Linear``
    whose weight is int8 in ``sd`` becomes an :class:`Int8Linear` holding the int8 weight; without ``resident``
    the weights are dequantized to float32 at load (memory as the float model: for measurement only).

    Raises:
        ValueError: a malformed quantized block, or an unknown ``quantization``.
    """
    if quantization is None:
        layer.load_state_dict(sd, strict=True, assign=True)
        return
    if quantization != INT8:
        raise ValueError(f"unknown quantization {quantization!r}; expected one of {QUANTIZATIONS}")
    if not resident:
        layer.load_state_dict(dequantize_block(sd, what), strict=True, assign=True)
        return
    for name in _check_int8(sd, what):
        path = name[: -len(".weight")]
        parent_name, _, child = path.rpartition(".")
        parent = layer.get_submodule(parent_name) if parent_name else layer
        lin = getattr(parent, child, None)
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"{what}: int8 weight {name} is not the weight of a linear layer")
        with torch.device("meta"):
            setattr(parent, child, Int8Linear(lin.in_features, lin.out_features, lin.bias is not None))
    layer.load_state_dict(sd, strict=True, assign=True)
