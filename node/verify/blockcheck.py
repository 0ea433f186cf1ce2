"""Checking a fetched model file against the hash its manifest commits to (:mod:`node.verify.blockfetch`): the bytes
are parsed with ``safetensors`` (never pickle, never ``torch.load``) and their
:func:`~node.compute.model.tensors_hash` compared with the expected one.
"""

from __future__ import annotations

from pathlib import Path

from ..compute.model import tensors_hash

__all__ = ["check_block", "check_block_file"]


def check_block(data: bytes, expected: bytes) -> None:
    """Parse safetensors ``data`` and check its :func:`tensors_hash` is ``expected`` (32 bytes).

    Raises:
        ValueError: not a safetensors file, or another hash.
    """
    # local: safetensors.torch imports torch (seconds); a node that never fetches a model does not pay it
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
    except (SafetensorError, ValueError, OSError) as e:
        raise ValueError(f"not a safetensors file: {e}") from None
    got = tensors_hash(tensors)
    if got != expected:
        raise ValueError(f"hashes to {got.hex()[:16]}, the manifest says {expected.hex()[:16]}")


def check_block_file(path: Path, expected: bytes) -> None:
    """:func:`check_block` of the safetensors file at ``path`` (read by ``safetensors``, never pickle).

    Raises:
        ValueError: not a safetensors file, or another hash.
    """
    # local: safetensors.torch imports torch (seconds); a node that never fetches a model does not pay it
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, ValueError, OSError) as e:
        raise ValueError(f"not a safetensors file: {e}") from None
    got = tensors_hash(tensors)
    if got != expected:
        raise ValueError(f"hashes to {got.hex()[:16]}, the manifest says {expected.hex()[:16]}")
