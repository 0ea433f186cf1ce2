"""Content-addressed blobs of session tensors, kept by worker and requester for committee re-execution.

A blob is an ordered list of tensors (a session's step inputs or step outputs) addressed by the RFC 9162
Merkle root over their tensor commitments — the same root the receipt commits to — so a fetched blob is
checked against the receipt by recomputing the root. Stored as msgpack files ``blobs/<root hex>`` in the data
dir; never pickle, never ``torch.load``.

Serving (:func:`serve_blob`, what a node registers for ``BLOB_PROTOCOL``): the stored file is already the msgpack
encoding of the reply's ``tensors`` list, so it is streamed from disk one 1 MiB frame at a time
(:func:`node.p2p.filesend.serve_file`, ``raw``) under the node's reply budget and write deadlines, never unpacked
and packed again in memory; ``not_found``, ``too_large`` (over :data:`MAX_BLOB`) and ``busy`` are error replies.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from .encoding import MAX_MESSAGE, DecodeError, commitments_root, pack, tensor_from_wire, tensor_to_wire, unpack
from .identity import account_to_str
from .p2p.budget import ReplyBudget
from .p2p.filesend import STALL, serve_file, write_error
from .p2p.framing import ByteReader, ByteWriter, FrameError, RemoteError, RequestTimeout, StreamClosed, read_msg
from .p2p.host import PeerUnreachable

BLOB_PROTOCOL = "/tally/blob/1.0.0"
MAX_BLOB = MAX_MESSAGE - (1 << 16)  # bytes of a stored blob served or fetched (its reply fits one message)
REQUEST_MAX = 1 << 12  # bytes: a blob request
REQUEST_TIMEOUT = 10.0  # seconds a server waits for the request after the stream opens


class BlobHost(Protocol):
    """What :func:`fetch_blob` needs of the host (:class:`node.p2p.host.P2PHost`): one request and its reply,
    within ``timeout`` seconds, the reply read up to ``max_message`` bytes.

    Raises (``request``): ``PeerUnreachable``, ``RemoteError``, ``StreamClosed``, ``FrameError``,
    ``RequestTimeout`` of :mod:`node.p2p`."""

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int = ...) -> dict[str, Any]: ...


class BlobStream(ByteReader, ByteWriter, Protocol):
    """The stream :func:`serve_blob` reads the request from and writes the reply to (a libp2p ``INetStream``)."""


class BlobMismatch(ValueError):
    """Tensors whose Merkle root is not the requested one."""


class BlobStore:
    """The blobs of one data dir, one file each under ``<root>/blobs``, named by the hex of their root."""

    def __init__(self, root: Path):
        self.dir = root / "blobs"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: bytes) -> Path:
        return self.dir / key.hex()

    def put(self, tensors: list[Any]) -> bytes:
        """Store tensors; returns their 32-byte Merkle root (the key)."""
        key = commitments_root(tensors)
        path = self._path(key)
        if not path.exists():
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(pack([tensor_to_wire(t) for t in tensors]))
            os.replace(tmp, path)
        return key

    def get_wire(self, key: bytes) -> list[Any] | None:
        """The stored wire tensors for ``key``, or None."""
        if len(key) != 32:
            return None
        path = self._path(key)
        if not path.exists():
            return None
        wire: list[Any] = unpack(path.read_bytes())  # written by put: a list of wire tensors
        return wire

    def delete(self, key: bytes) -> bool:
        """Remove blob ``key``; whether it was there."""
        path = self.path_of(key)
        if path is None or not path.exists():
            return False
        path.unlink(missing_ok=True)
        return True

    def has(self, key: bytes) -> bool:
        return len(key) == 32 and self._path(key).exists()

    def path_of(self, key: object) -> Path | None:
        """The file of blob ``key`` (32 bytes) whether or not it exists; None for a malformed key."""
        return self._path(key) if isinstance(key, bytes) and len(key) == 32 else None


async def serve_blob(blobs: BlobStore, budget: ReplyBudget, stream: BlobStream, peer: str, *, stall: float = STALL,
                     request_timeout: float = REQUEST_TIMEOUT) -> None:
    """The ``BLOB_PROTOCOL`` stream handler: ``{"type": "get", "root": 32 B}`` → ``{"status": "ok", "tensors":
    [...]}`` streamed from the stored file (module docstring), or ``not_found``, ``too_large``, ``busy``,
    ``bad_request``.

    Raises:
        FrameError: a malformed or oversized request (the host answers ``bad_frame`` and penalises the peer).
        RequestTimeout, StreamClosed: the request did not come or the reply was not written in time (the host
            resets the stream).
    """
    msg = await read_msg(stream, timeout=request_timeout, max_message=REQUEST_MAX)
    path = blobs.path_of(msg.get("root"))
    if path is None:
        await write_error(stream, "bad_request", "root must be 32 bytes")
        return
    await serve_file(stream, peer, path, limit=MAX_BLOB, budget=budget, key="tensors", raw=True, stall=stall)


def decode_blob(wire: object, key: bytes) -> list[Any]:
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


async def fetch_blob(host: BlobHost, blobs: BlobStore, root: bytes, holders: list[bytes], timeout: float = 60,
                     keep: bool = True) -> list[Any]:
    """Tensors with Merkle root ``root`` from the local store, else from the first of ``holders`` (accounts,
    tried in order over ``BLOB_PROTOCOL``) whose reply matches the root. ``keep``: store a fetched blob locally.
    ``timeout`` in seconds per holder.

    Raises:
        BlobUnavailable: nobody returned matching tensors (the message lists each holder's failure).
    """
    local = blobs.get_wire(root) if blobs.has(root) else None
    if local is not None:
        return decode_blob(local, root)
    errors: list[str] = []
    for holder in holders:
        peer = account_to_str(holder)
        try:
            reply = await host.request(peer, BLOB_PROTOCOL, {"type": "get", "root": root}, timeout=timeout,
                                       max_message=MAX_BLOB + (1 << 16))
            tensors = decode_blob(reply.get("tensors"), root)
        except (PeerUnreachable, RemoteError, StreamClosed, FrameError, RequestTimeout, ValueError, TypeError,
                KeyError) as e:  # unreachable, timeout, not found, busy, malformed, mismatch: try the next holder
            errors.append(f"{peer[:16]}: {type(e).__name__}: {e}")
            continue
        if keep:
            blobs.put(tensors)
        return tensors
    raise BlobUnavailable(f"blob {root.hex()[:16]} unavailable: {'; '.join(errors)}")
