"""Content-addressed blobs of session tensors, kept by worker and requester for committee re-execution.

A blob is an ordered list of tensors (a session's step inputs or step outputs) addressed by the RFC 9162
Merkle root over their tensor commitments — the same root the receipt commits to — so a fetched blob is
checked against the receipt by recomputing the root. Stored as msgpack files ``blobs/<root hex>`` in the data
dir; never pickle, never ``torch.load``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .encoding import DecodeError, commitments_root, pack, tensor_from_wire, tensor_to_wire, unpack

BLOB_PROTOCOL = "/tally/blob/1.0.0"


class BlobMismatch(ValueError):
    """Tensors whose Merkle root is not the requested one."""


class BlobStore:
    def __init__(self, root: Path):
        self.dir = root / "blobs"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: bytes) -> Path:
        return self.dir / key.hex()

    def put(self, tensors: list) -> bytes:
        """Store tensors; returns their 32-byte Merkle root (the key)."""
        key = commitments_root(tensors)
        path = self._path(key)
        if not path.exists():
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(pack([tensor_to_wire(t) for t in tensors]))
            os.replace(tmp, path)
        return key

    def get_wire(self, key: bytes) -> list | None:
        """The stored wire tensors for ``key``, or None."""
        if len(key) != 32:
            return None
        path = self._path(key)
        if not path.exists():
            return None
        return unpack(path.read_bytes())

    def has(self, key: bytes) -> bool:
        return len(key) == 32 and self._path(key).exists()


def decode_blob(wire: list, key: bytes) -> list:
    """Decode wire tensors and check they hash to ``key``.

    Raises:
        BlobMismatch: the root differs. DecodeError: malformed tensors.
    """
    if not isinstance(wire, list):
        raise DecodeError("a blob is a list of tensors")
    tensors = [tensor_from_wire(w) for w in wire]
    if commitments_root(tensors) != key:
        raise BlobMismatch("blob does not match its committed root")
    return tensors


class BlobUnavailable(LookupError):
    """Nobody who should hold a blob returned tensors matching its root."""


async def fetch_blob(host, blobs: BlobStore, root: bytes, holders: list[bytes], timeout: float = 60,
                     keep: bool = True) -> list:
    """Tensors with Merkle root ``root`` from the local store, else from the first of ``holders`` (accounts,
    tried in order over ``BLOB_PROTOCOL``) whose reply matches the root. ``keep``: store a fetched blob locally.
    ``timeout`` in seconds per holder.

    Raises:
        BlobUnavailable: nobody returned matching tensors (the message lists each holder's failure).
    """
    from .identity import account_to_str

    if blobs.has(root):
        return decode_blob(blobs.get_wire(root), root)
    errors = []
    for holder in holders:
        peer = account_to_str(holder)
        try:
            reply = await host.request(peer, BLOB_PROTOCOL, {"type": "get", "root": root}, timeout=timeout)
            tensors = decode_blob(reply.get("tensors"), root)
        except Exception as e:  # unreachable, timeout, not found, mismatch: try the next holder
            errors.append(f"{peer[:16]}: {type(e).__name__}: {e}")
            continue
        if keep:
            blobs.put(tensors)
        return tensors
    raise BlobUnavailable(f"blob {root.hex()[:16]} unavailable: {'; '.join(errors)}")
