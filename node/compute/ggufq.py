"""GGUF-quantized tensors as stored in a block or head file, dequantized at load (issue 36).

``node model add MODEL.gguf`` keeps each tensor in the GGUF file's own type (Q4_K, Q8_0, F16, ...): a stored
tensor named ``<name>.gguf_<TYPE>`` holds the GGUF bytes of ``<name>`` as ``uint8`` of shape
``(*rows, bytes_per_row)``, exactly as ``gguf.GGUFReader`` maps them (llama.cpp's row-major layout: each row is a
run of independent quantization blocks along the last axis). The type is part of the name, so the file's hash
(:func:`node.compute.model.tensors_hash`, over names and bytes) commits to it: a file whose type was relabelled
no longer matches its manifest. F32 tensors are stored as float32 under their own name.

Dequantization is gguf-py's :func:`gguf.quants.dequantize` per tensor, the function transformers' GGUF loader
applies to the whole file (``transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint``), so a block loaded
here equals the same block of a model dequantized at once, bit for bit. The row permutation transformers applies
to Llama's q/k projections afterwards is applied to the stored rows at conversion instead: dequantization works
row by row, so permuting quantized rows and then dequantizing gives the same floats as the reverse order.

Every stored tensor is checked before it is dequantized (dtype, rank, whole quantization blocks per row, a type
on :data:`TYPES`), and only after the file's hash was checked against its manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MARK = ".gguf_"
# GGUF types a block may be stored in: llama.cpp's legacy and k-quants and the 16-bit floats, all of which gguf-py
# dequantizes in numpy. Others (the IQ and ternary types) are refused at conversion with a clear message.
TYPES = ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")


class QuantizedTensorError(ValueError):
    """A stored GGUF tensor is malformed: wrong dtype or shape, or an unknown type."""


def stored_name(name: str, type_name: str) -> str:
    """The stored name of tensor ``name`` kept as GGUF type ``type_name`` (``F32`` keeps its own name).

    Raises:
        QuantizedTensorError: ``type_name`` is not on :data:`TYPES` or F32.
    """
    if type_name == "F32":
        return name
    if type_name not in TYPES:
        raise QuantizedTensorError(f"{name}: GGUF type {type_name} is not one Tally stores "
                                   f"(supported: F32, {', '.join(TYPES)})")
    return f"{name}{MARK}{type_name}"


def pack_float(name: str, t: torch.Tensor, type_name: str) -> tuple[str, torch.Tensor]:
    """``(stored name, uint8 bytes)`` of float tensor ``t`` (rank ≥ 2, any float dtype) kept as 16-bit GGUF type
    ``type_name`` (``"BF16"`` or ``"F16"``): the values cast to that dtype (round to nearest even), their
    little-endian bytes viewed as ``uint8`` of shape ``(*rows, 2 * cols)``, the layout :func:`dequantize_stored`
    reads back. A tensor already of that dtype is kept bit for bit.

    Raises:
        QuantizedTensorError: ``type_name`` is not BF16 or F16, or ``t`` has rank < 2.
    """
    import torch  # local: see dequantize_stored

    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16}
    if type_name not in dtypes:
        raise QuantizedTensorError(f"{name}: {type_name} is not a 16-bit float type (BF16, F16)")
    if t.dim() < 2:
        raise QuantizedTensorError(f"{name}: only tensors of rank >= 2 are kept in 16 bits, got {tuple(t.shape)}")
    half = t.detach().to(dtypes[type_name]).contiguous()
    return stored_name(name, type_name), half.view(torch.uint8).clone()


def split_name(stored: str) -> tuple[str, str | None]:
    """``(name, type)`` of a stored name; ``type`` None for a tensor stored as is."""
    name, mark, type_name = stored.rpartition(MARK)
    if not mark:
        return stored, None
    return name, type_name


def logical_shape(raw_shape: tuple[int, ...], type_name: str) -> tuple[int, ...]:
    """The float tensor's shape of stored bytes of ``raw_shape`` in GGUF type ``type_name``.

    Raises:
        QuantizedTensorError: an unknown type, or a last axis that is not whole quantization blocks.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # local: ~0.3 s, needed only for GGUF-stored models

    if type_name not in TYPES:
        raise QuantizedTensorError(f"GGUF type {type_name!r} is not one Tally stores")
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    if not raw_shape or raw_shape[-1] % type_size:
        raise QuantizedTensorError(f"{type_name}: {raw_shape[-1] if raw_shape else 0} bytes per row are not "
                                   f"whole blocks of {type_size} bytes")
    return (*raw_shape[:-1], raw_shape[-1] // type_size * block_size)


def dequantize_stored(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{name: float32 tensor}`` of a loaded file's tensors: GGUF-stored ones dequantized, the rest as they are.

    Args:
        tensors: ``{stored name: torch tensor}`` as read from a block or head file whose hash was checked.

    Raises:
        QuantizedTensorError: a GGUF-stored tensor is not ``uint8`` of rank ≥ 2 with whole blocks per row, its type
            is unknown, or two stored tensors dequantize to the same name.
    """
    if not any(MARK in k for k in tensors):
        return dict(tensors)
    # local: numpy, torch and gguf (~2 s), only for GGUF-stored models; the caller loads weights anyway
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, dequantize

    out: dict[str, torch.Tensor] = {}
    for stored, t in tensors.items():
        name, type_name = split_name(stored)
        if name in out:
            raise QuantizedTensorError(f"{name} is stored twice")
        if type_name is None:
            out[name] = t
            continue
        if t.dtype != torch.uint8 or t.dim() < 2:
            raise QuantizedTensorError(f"{stored}: GGUF bytes must be uint8 of rank >= 2, got {t.dtype} "
                                       f"{tuple(t.shape)}")
        shape = logical_shape(tuple(t.shape), type_name)
        floats = dequantize(np.ascontiguousarray(t.numpy()), GGMLQuantizationType[type_name])
        out[name] = torch.from_numpy(np.ascontiguousarray(floats, dtype=np.float32).reshape(shape))
    return out
