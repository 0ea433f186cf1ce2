"""Block files in checked chunks: the index a server sends and the checks a fetcher makes (issue 36).

A block of a large model is gigabytes; one reply per file cannot carry it (messages stop at 64 MiB), and a file
checked only once whole is lost whole to one bad byte or one dropped connection. Here a file is fetched in ranges
of at most :data:`CHUNK` bytes, and each tensor is checked as soon as its last range arrives:

* ``{"type": "index", "model_id", "index": i}`` → ``{"header": bytes, "commitments": {name: 32 B}}``: the
  safetensors header of block ``i`` (``-1``: the head file) and each tensor's commitment
  (:func:`node.encoding.tensor_commitment`: BLAKE2b of dtype, shape and bytes). The fetcher parses the header with
  bounds (:func:`parse_index`: size, tensor count, dtypes, shapes, offsets that tile the data) and accepts the
  commitments only when ``H(pack([[name, commitment] for sorted names]))`` — :func:`~node.compute.model.tensors_hash`
  — is the manifest's hash of that file: the index is checked before a byte of data is asked for.
* ``{"type": "range", "model_id", "index": i, "offset": o, "length": n}`` → ``{"data": n bytes}`` of the file.
  A tensor's ranges are hashed as they arrive (the commitment is a streaming hash) and written to a part file at
  their offsets; a tensor whose hash differs is dropped and asked of the next peer.

A fetch is resumable: the tensors already checked are listed beside the part file (``<file>.part.json``, with
the index's digest), and a new fetch of the same file skips them. The finished file is checked once more whole
(:func:`~node.verify.blockcheck.check_block_file`) and moved into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ..encoding import HASH_LEN, H, pack

CHUNK = 1 << 20  # bytes: the largest range one request asks for (one frame; a reply fits a node's reply budget)
MAX_HEADER = 1 << 20  # bytes: a safetensors header (JSON) accepted in an index
MAX_TENSORS = 4096  # tensors one file may hold
# safetensors dtype codes -> the numpy names tensor_commitment hashes (node.encoding.tensor_to_wire), and bytes each
DTYPES = {"F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2), "F64": ("float64", 8),
          "U8": ("uint8", 1), "I8": ("int8", 1), "I16": ("int16", 2), "I32": ("int32", 4), "I64": ("int64", 8)}


class BadIndex(ValueError):
    """A file index (header or commitments) is malformed or does not match the manifest."""


@dataclass(frozen=True)
class TensorRange:
    """One tensor of a file: its name, wire dtype name, shape and absolute byte range ``[start, end)``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    def hasher(self) -> hashlib.blake2b:
        """A BLAKE2b fed the commitment's prefix; feeding it the tensor's bytes gives its commitment."""
        h = hashlib.blake2b(digest_size=HASH_LEN)
        h.update(self.dtype.encode())
        h.update(pack(list(self.shape)))
        return h


@dataclass(frozen=True)
class FileIndex:
    """A checked index: the header bytes, the tensors by offset, the commitments and the file's total size."""

    header: bytes
    tensors: tuple[TensorRange, ...]
    commitments: dict[str, bytes]
    size: int

    def digest(self) -> str:
        """Hex digest naming this index (a resumed fetch continues only the same one)."""
        return H(self.header, pack(sorted(self.commitments.items()))).hex()


def parse_index(header: object, commitments: object, expected: bytes, max_size: int) -> FileIndex:
    """Check an index reply against the manifest's hash ``expected`` of the file, and its size against
    ``max_size`` bytes.

    Raises:
        BadIndex: a header over :data:`MAX_HEADER` bytes or not safetensors JSON, over :data:`MAX_TENSORS`
            tensors, an unknown dtype, a shape that does not match its byte range, ranges that do not tile the
            data, a file over ``max_size``, commitments missing or of the wrong length, or a hash other than
            ``expected``.
    """
    if not isinstance(header, bytes) or not 8 < len(header) <= MAX_HEADER + 8:
        raise BadIndex("the header must be bytes, at most 1 MiB")
    (n,) = struct.unpack("<Q", header[:8])
    if n != len(header) - 8:
        raise BadIndex("the header's length prefix does not match its size")
    try:
        meta = json.loads(header[8:])
    except (ValueError, UnicodeDecodeError):
        raise BadIndex("the header is not JSON") from None
    if not isinstance(meta, dict) or len(meta) > MAX_TENSORS + 1:
        raise BadIndex(f"the header must be a JSON object of at most {MAX_TENSORS} tensors")
    if not isinstance(commitments, dict) or len(commitments) > MAX_TENSORS:
        raise BadIndex("commitments must be a map of tensor names")
    tensors = []
    for name, spec in meta.items():
        if name == "__metadata__":
            continue
        if not (isinstance(spec, dict) and spec.get("dtype") in DTYPES and isinstance(spec.get("shape"), list)
                and isinstance(spec.get("data_offsets"), list) and len(spec["data_offsets"]) == 2):
            raise BadIndex(f"tensor {name!r}: dtype, shape and data_offsets required")
        shape, (a, b) = spec["shape"], spec["data_offsets"]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in [*shape, a, b]):
            raise BadIndex(f"tensor {name!r}: shape and offsets must be non-negative integers")
        wire, size = DTYPES[spec["dtype"]]
        numel = 1
        for x in shape:
            numel *= x
        if b - a != numel * size:
            raise BadIndex(f"tensor {name!r}: {b - a} bytes for shape {shape}")
        tensors.append(TensorRange(name, wire, tuple(shape), 8 + n + a, 8 + n + b))
    tensors.sort(key=lambda t: t.start)
    at = 8 + n
    for t in tensors:
        if t.start != at:
            raise BadIndex("the tensors' byte ranges do not tile the file's data")
        at = t.end
    if at > max_size:
        raise BadIndex(f"the file is {at} bytes, over the {max_size} this model's config allows")
    names = {t.name for t in tensors}
    if set(commitments) != names or not all(isinstance(c, bytes) and len(c) == HASH_LEN
                                            for c in commitments.values()):
        raise BadIndex("commitments must name every tensor, 32 bytes each")
    if H(pack([[k, commitments[k]] for k in sorted(names)])) != expected:
        raise BadIndex("the commitments do not hash to the manifest's entry for this file")
    return FileIndex(bytes(header), tuple(tensors), dict(commitments), at)


# ---------------------------------------------------------------- serving side

_INDEX_CACHE: OrderedDict[tuple[str, int, int], tuple[bytes, dict[str, bytes]]] = OrderedDict()
_INDEX_CACHE_MAX = 64


def file_index(path: Path) -> tuple[bytes, dict[str, bytes]]:
    """``(header bytes, {name: commitment})`` of the safetensors file at ``path``, the commitments hashed from the
    file in 1 MiB pieces (blocking; the last :data:`_INDEX_CACHE_MAX` files' indexes are kept, by path, size and
    modification time).

    Raises:
        OSError: unreadable.  BadIndex: not a safetensors file this module can index.
    """
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _INDEX_CACHE:
        _INDEX_CACHE.move_to_end(key)
        return _INDEX_CACHE[key]
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise BadIndex(f"{path.name} is not a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise BadIndex(f"{path.name}: header over {MAX_HEADER} bytes")
        header = head + f.read(n)
        commitments = {}
        for name, spec in json.loads(header[8:]).items():
            if name == "__metadata__":
                continue
            wire, _size = DTYPES[spec["dtype"]]
            t = TensorRange(name, wire, tuple(spec["shape"]), 8 + n + spec["data_offsets"][0],
                            8 + n + spec["data_offsets"][1])
            h = t.hasher()
            f.seek(t.start)
            left = t.end - t.start
            while left:
                piece = f.read(min(left, 1 << 20))
                if not piece:
                    raise BadIndex(f"{path.name} is shorter than its header says")
                h.update(piece)
                left -= len(piece)
            commitments[name] = h.digest()
    _INDEX_CACHE[key] = (header, commitments)
    while len(_INDEX_CACHE) > _INDEX_CACHE_MAX:
        _INDEX_CACHE.popitem(last=False)
    return header, commitments


def read_range(path: Path, offset: int, length: int) -> bytes:
    """``length`` bytes of ``path`` from ``offset`` (blocking); fewer at the end of the file."""
    with open(path, "rb") as f:
        return os.pread(f.fileno(), length, offset)
