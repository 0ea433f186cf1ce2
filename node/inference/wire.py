"""Hidden states on the wire: the dtype as it is, a small header, optional compression chosen by the client.

A step's hidden states ``(1, tokens, hidden)`` travel as a msgpack map — ``{"dtype": "float32" | "float16",
"shape": [1, tokens, hidden], "data": bytes}`` — about 35 bytes of header on ``tokens × hidden × itemsize``
bytes of little-endian payload. With a ``zstd`` codec the payload key is ``"zstd"`` and holds one zstd frame
whose header declares the raw size.

Codecs (the client picks one in ``open``; it is recorded in the receipt's ``compression`` field):

* ``none``: float32, lossless.
* ``fp16``: float16 both ways (half the bytes); the server computes in float32 from the float16 inputs.
* ``zstd``: float32 through zstd (lossless; float noise compresses little).
* ``fp16+zstd``: both.

Commitments are over the tensors as they travelled (after any fp16 rounding, before any zstd), so the committee
re-executes exactly what the server received and compares with exactly what the client received.

Every decode is checked before anything is allocated from a peer's numbers: the dtype must be the codec's,
the shape ``[1, tokens, hidden]`` with ``1 <= tokens <= max_positions``, the raw byte count must match the
shape, a zstd frame must declare exactly that size (a tiny frame cannot declare gigabytes), no trailing data,
and every value finite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

import zstandard

from ..encoding import DecodeError
from .receipts import CLOCK, wire_commitment

if TYPE_CHECKING:
    import torch

CODECS = ("none", "fp16", "zstd", "fp16+zstd")
# a tensor's commitment before it is hashed: (wire dtype name, shape, little-endian bytes), for wire_commitment
WireParts = tuple[str, list[int], bytes]
WireMap = dict[str, Any]  # hidden states on the wire: {"dtype", "shape", "data" | "zstd"}
ZSTD_LEVEL = 3

_zc: zstandard.ZstdCompressor | None = None
_zd: zstandard.ZstdDecompressor | None = None


def check_codec(codec: object) -> str:
    """Return ``codec`` if it is one of :data:`CODECS`.

    Raises:
        ValueError: unknown codec.
    """
    if not isinstance(codec, str) or codec not in CODECS:
        raise ValueError(f"unknown compression {codec!r}; expected one of {', '.join(CODECS)}")
    if "zstd" in codec:
        _zstd()  # the compressor and decompressor, made once
    return codec


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    global _zc, _zd
    if _zc is None or _zd is None:
        _zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
        _zd = zstandard.ZstdDecompressor()
    return _zc, _zd


def codec_dtype(codec: str) -> tuple[str, torch.dtype]:
    """Wire dtype name and torch dtype of a codec's hidden states."""
    import torch  # local: torch takes ~2 s to import; a node checks codecs (check_codec) long before a first step

    return ("float16", torch.float16) if codec.startswith("fp16") else ("float32", torch.float32)


@overload
def encode_hidden(t: torch.Tensor, codec: str, commit: Literal[True] = ...) -> tuple[WireMap, torch.Tensor, bytes]: ...


@overload
def encode_hidden(t: torch.Tensor, codec: str, commit: Literal[False]) -> tuple[WireMap, torch.Tensor, WireParts]: ...


def encode_hidden(t: torch.Tensor, codec: str, commit: bool = True) -> tuple[WireMap, torch.Tensor, bytes | WireParts]:
    """Encode hidden states for the wire.

    Args:
        t: ``(1, tokens, hidden)`` floating tensor on any device.
        codec: one of :data:`CODECS`.
        commit: compute the commitment now; False returns its parts ``(dtype, shape, raw bytes)`` instead, for
            :func:`~node.inference.receipts.wire_commitment` later.

    Returns:
        ``(wire map, tensor as sent, commitment)``: the tensor as sent is a CPU tensor in the codec's dtype
        (what the receiver decodes, bit for bit); the commitment is its 32-byte tensor commitment.
    """
    name, dtype = codec_dtype(codec)
    sent = t.detach().to(device="cpu", dtype=dtype).contiguous()
    arr = sent.numpy()
    arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    data = arr.tobytes()
    shape = list(arr.shape)
    commitment: bytes | WireParts
    if commit:
        with CLOCK:
            commitment = wire_commitment(name, shape, data)
    else:
        commitment = (name, shape, data)
    if "zstd" in codec:
        return {"dtype": name, "shape": shape, "zstd": _zstd()[0].compress(data)}, sent, commitment
    return {"dtype": name, "shape": shape, "data": data}, sent, commitment


@overload
def decode_hidden(obj: object, codec: str, hidden_size: int, max_positions: int, positions: int | None = None,
                  commit: Literal[True] = ...) -> tuple[torch.Tensor, bytes]: ...


@overload
def decode_hidden(obj: object, codec: str, hidden_size: int, max_positions: int, positions: int | None = None, *,
                  commit: Literal[False]) -> tuple[torch.Tensor, WireParts]: ...


def decode_hidden(obj: object, codec: str, hidden_size: int, max_positions: int, positions: int | None = None,
                  commit: bool = True) -> tuple[torch.Tensor, bytes | WireParts]:
    """Decode and check hidden states from a peer.

    Args:
        obj: the wire map.  codec: the session's codec.  hidden_size: model width.
        max_positions: most tokens this step may carry (the session's remaining length).
        positions: when given, the exact number of tokens expected (a reply must match its request).
        commit: as for :func:`encode_hidden`.

    Returns:
        ``(tensor, commitment)``: a CPU tensor ``(1, tokens, hidden)`` in the codec's dtype (float16 or float32)
        and its 32-byte commitment.

    Raises:
        DecodeError: not a map, wrong dtype for the codec, bad shape or token count, byte count that does not
            match the shape, a zstd frame that does not declare exactly that size or has trailing data,
            non-finite values.
    """
    # local: torch takes ~2 s to import, numpy ~0.2 s; a node checks codecs (check_codec) long before a first step
    import numpy as np
    import torch

    if not isinstance(obj, dict):
        raise DecodeError("hidden states must be a map")
    name, _ = codec_dtype(codec)
    if obj.get("dtype") != name:
        raise DecodeError(f"dtype {obj.get('dtype')!r} is not this session's {name} ({codec})")
    shape = obj.get("shape")
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
        raise DecodeError("shape must be [1, tokens, hidden]")
    _, n, h = shape
    if shape[0] != 1 or h != hidden_size or not 1 <= n <= max_positions:
        raise DecodeError(f"shape {shape} is not [1, 1..{max_positions}, {hidden_size}]")
    if positions is not None and n != positions:
        raise DecodeError(f"{n} positions, expected {positions}")
    itemsize = 2 if name == "float16" else 4
    expect = n * h * itemsize
    if "zstd" in codec:
        data = _unzstd(obj.get("zstd"), expect)
    else:
        raw = obj.get("data")
        if not isinstance(raw, bytes) or len(raw) != expect:
            raise DecodeError(f"shape {shape} of {name} needs {expect} bytes, got "
                              f"{len(raw) if isinstance(raw, bytes) else type(raw).__name__}")
        data = raw
    arr = np.frombuffer(data, dtype=np.dtype(np.float16 if itemsize == 2 else np.float32).newbyteorder("<"))
    arr = arr.astype(arr.dtype.newbyteorder("="), copy=True)
    if not np.isfinite(arr).all():
        raise DecodeError("hidden states must be finite")
    t = torch.from_numpy(arr).reshape(1, n, h)
    if not commit:
        return t, (name, shape, data)
    with CLOCK:
        commitment = wire_commitment(name, shape, data)
    return t, commitment


def _unzstd(payload: object, expect: int) -> bytes:
    if not isinstance(payload, bytes):
        raise DecodeError("zstd payload must be bytes")
    zd = _zstd()[1]
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as e:
        raise DecodeError(f"bad zstd frame: {e}") from None
    if declared != expect:
        raise DecodeError(f"zstd frame declares {declared} bytes, the shape needs {expect}")
    try:
        data = zd.decompress(payload, max_output_size=expect, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise DecodeError(f"bad zstd frame: {e}") from None
    if len(data) != expect:
        raise DecodeError(f"zstd frame holds {len(data)} bytes, the shape needs {expect}")
    return data
