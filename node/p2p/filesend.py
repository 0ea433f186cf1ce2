"""Replies whose bulk is a file, streamed from disk in frames, under a write deadline and a reply budget
(issue 23, "Budgets for bulk replies").

A reply such as ``{"status": "ok", "data": <a 48 MiB block file>}`` used to be read whole into memory, packed
(a second copy) and split into frames (a third) before the first byte went out, and written with no deadline:
eight 60-byte requests for a 16 MiB file, never read, raised a node's RSS by ~270 MiB. Here the same message is
written without ever holding more than one frame of the file:

* msgpack lets the map's header, its small fields and the ``data`` key, then a ``bin 32`` header (``0xc6`` and a
  4-byte big-endian length, :data:`BIN32`) be written before the bin's bytes, so the reply is that prefix followed
  by the file's bytes, read ``MAX_FRAME`` (1 MiB) at a time;
* the bytes go out in frames of :mod:`node.p2p.framing` (its ``HEADER`` and ``MORE``), the first carrying the
  prefix and the start of the file, the last with ``MORE`` clear. The receiver is unchanged: :func:`read_msg`
  reassembles the same bytes that :func:`~node.p2p.framing.write_msg` would have written for that map (bin 32 is
  a valid encoding of any bin; msgpack decoders accept it for every length).

Every write runs under a deadline for the whole reply (``timeout``) and one per frame (``stall``), so a reader
that never reads holds a task, a file handle, one frame and its budget reservation for ``stall`` seconds at most.
:func:`serve_file` puts it together: open and size-check the file, reserve its memory from a
:class:`~node.p2p.budget.ReplyBudget`, stream it; ``not_found``, ``too_large`` and ``busy`` go back as ordinary
error replies.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import trio

from ..encoding import MAX_FRAME, pack
from .budget import ReplyBudget
from .framing import (
    HEADER,
    MORE,
    STATS,
    ByteWriter,
    RemoteError,
    RequestTimeout,
    StreamClosed,
    _io_errors,
    error_reply,
    write_msg,
)

__all__ = ["BIN32", "MIN_RATE", "STALL", "STREAM_HOLD", "WRITE_BASE", "file_prefix", "open_sized", "reply_deadline",
           "serve_file", "size_of", "write_error", "write_file_msg"]

BIN32 = 0xC6  # msgpack "bin 32" type byte: followed by a 4-byte big-endian length and that many bytes
MAX_PREFIX = 1 << 16  # bytes: a file reply's fields before its data, at most
STALL = 10.0  # seconds one frame's write may take (a reader that stops reading is cut after this)
WRITE_BASE = 10.0  # seconds: the whole reply's deadline is WRITE_BASE + its size / MIN_RATE
MIN_RATE = 1 << 20  # bytes per second: the slowest reader served to the end of a large reply
STREAM_HOLD = 2 * MAX_FRAME  # bytes a streamed reply holds in memory at once (one file chunk + transport copies)
ERROR_TIMEOUT = 5.0  # seconds allowed to write an error reply


def reply_deadline(nbytes: int, base: float = WRITE_BASE, min_rate: float = MIN_RATE) -> float:
    """Seconds allowed to write a reply of ``nbytes`` bytes: ``base + nbytes / min_rate`` (10 s + 1 s per MiB
    by default; 58 s for a 48 MiB block)."""
    return base + nbytes / min_rate


def file_prefix(size: int, fields: Mapping[str, Any] | None = None, key: str = "data", raw: bool = False) -> bytes:
    """The msgpack bytes of a map ``{**fields, key: <size bytes>}`` up to (not including) the bin's payload:
    map header, the packed fields, the packed key, then ``0xc6`` and ``size`` as 4 bytes big-endian. ``raw``: the
    file's bytes are themselves one msgpack value (e.g. a stored blob's tensor list), sent as the key's value
    without a bin header.

    Raises:
        ValueError: ``size`` not in [0, 2**32), ``key`` in ``fields``, more than 65,534 fields, or fields
            packing to more than :data:`MAX_PREFIX` bytes.
        TypeError: a field msgpack cannot encode.
    """
    fields = dict(fields or {})
    if not 0 <= size < 1 << 32:
        raise ValueError(f"a bin of {size} bytes cannot be encoded")
    if key in fields:
        raise ValueError(f"{key!r} is the file's key, not a field")
    n = len(fields) + 1
    if n < 16:
        head = bytes([0x80 | n])
    elif n < 1 << 16:
        head = b"\xde" + struct.pack(">H", n)
    else:
        raise ValueError(f"{n} fields is too many")
    body = b"".join(pack(k) + pack(v) for k, v in fields.items())
    out = head + body + pack(key) + (b"" if raw else struct.pack(">BI", BIN32, size))
    if len(out) > MAX_PREFIX:
        raise ValueError(f"a file reply's fields pack to {len(out)} bytes, over {MAX_PREFIX}")
    return out


class Readable(Protocol):
    """What :func:`write_file_msg` reads from: a binary file, or a reader over one (``snapstore.VerifyingReader``)."""

    def read(self, n: int, /) -> bytes:
        """At most ``n`` bytes, fewer only at the end."""
        ...


async def write_file_msg(stream: ByteWriter, f: Readable, size: int, fields: Mapping[str, Any] | None = None, *,
                         key: str = "data", timeout: float | None = None, stall: float = STALL,
                         raw: bool = False) -> int:
    """Write the message ``{**fields, key: <the next size bytes of f>}`` to ``stream``, in frames of at most
    ``MAX_FRAME`` payload bytes, reading ``f`` one frame at a time (in a worker thread).

    Args:
        stream: anything with ``async write(bytes)`` (a libp2p stream).
        f: a file open for binary reading (or anything :class:`Readable`), positioned where the bin's bytes start.
        size: bytes of ``f`` to send.
        fields: small fields sent before the file (e.g. ``{"status": "ok"}``).
        key: the file's key in the map.
        timeout: seconds for the whole message (default :func:`reply_deadline` of its size).
        stall: seconds allowed for each frame's write.
        raw: the file holds one msgpack value, sent as is (no bin header; :func:`file_prefix`).

    Returns:
        Bytes written (frame headers included).

    Raises:
        RequestTimeout: ``timeout`` or ``stall`` elapsed (the peer is not reading fast enough).
        StreamClosed: the stream was closed or reset, or the file ended before ``size`` bytes (then the message
            is incomplete: reset the stream).
        ValueError, TypeError: bad ``size`` or ``fields`` (:func:`file_prefix`), before anything is written.
    """
    prefix = file_prefix(size, fields, key, raw)
    total = len(prefix) + size
    if timeout is None:
        timeout = reply_deadline(total)
    errors = _io_errors()
    sent = 0
    left = size
    first = True
    try:
        with trio.fail_after(timeout):
            while first or left:
                room = MAX_FRAME - (len(prefix) if first else 0)
                n = min(room, left)
                chunk = await trio.to_thread.run_sync(f.read, n) if n else b""
                if len(chunk) != n:
                    raise StreamClosed(f"the file ended {left - len(chunk)} bytes early")
                left -= n
                payload_len = (len(prefix) if first else 0) + n
                head = HEADER.pack(payload_len, MORE if left else 0)
                with trio.fail_after(stall):
                    await stream.write(head + prefix if first else head)
                    if chunk:
                        await stream.write(chunk)
                del chunk
                sent += len(head) + payload_len
                STATS["sent"] += len(head) + payload_len
                first = False
    except trio.TooSlowError:
        raise RequestTimeout(f"reply of {total} bytes: {sent} written before the write deadline "
                             f"({timeout:.1f} s, {stall:.1f} s per frame)") from None
    except errors as e:
        raise StreamClosed(f"stream closed while writing: {type(e).__name__}: {e}") from None
    return sent


async def write_error(stream: ByteWriter, code: str, message: str, timeout: float = ERROR_TIMEOUT) -> None:
    """Write ``error_reply(code, message)`` under a deadline of ``timeout`` seconds.

    Raises:
        RequestTimeout, StreamClosed: as :func:`~node.p2p.framing.write_msg`.
    """
    await write_msg(stream, error_reply(code, message), timeout=timeout)


def size_of(path: Path, limit: int) -> int:
    """The size of the file at ``path`` in bytes (blocking: call in a thread).

    Raises:
        RemoteError: ``not_found`` (no such file), ``too_large`` (over ``limit`` bytes).
    """
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise RemoteError("not_found", f"{path.name} is not held here") from None
    if not stat.S_ISREG(st.st_mode):
        raise RemoteError("not_found", f"{path.name} is not held here")
    if st.st_size > limit:
        raise RemoteError("too_large", f"{path.name} is {st.st_size} bytes, over the {limit}-byte limit")
    return st.st_size


def open_sized(path: Path, limit: int) -> tuple[BinaryIO, int]:
    """Open ``path`` for reading and size it (blocking: call in a thread).

    Raises:
        RemoteError: ``not_found`` (no such file), ``too_large`` (over ``limit`` bytes).
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - the caller closes it
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise RemoteError("not_found", f"{path.name} is not held here") from None
    size = os.fstat(f.fileno()).st_size
    if size > limit:
        f.close()
        raise RemoteError("too_large", f"{path.name} is {size} bytes, over the {limit}-byte limit")
    return f, size


async def serve_file(stream: ByteWriter, peer: str, path: Path, *, limit: int, budget: ReplyBudget,
                     fields: Mapping[str, Any] | None = None, key: str = "data", timeout: float | None = None,
                     stall: float = STALL, raw: bool = False) -> None:
    """Answer a request with ``{"status": "ok", **fields, key: <the file at path>}``, streamed from disk
    (:func:`write_file_msg`) while :data:`STREAM_HOLD` bytes are reserved for ``peer`` in ``budget``; or with an
    error reply: ``not_found``, ``too_large`` (over ``limit`` bytes), ``busy`` (no room in the budget within its
    wait). The file is sized first, opened only once the reservation is granted (a request waiting for room holds
    no file descriptor) and closed after, whatever happens; a file replaced on disk meanwhile (``os.replace``) is
    sent as it was opened. ``raw``: the file is one msgpack value, sent as the key's value (:func:`file_prefix`);
    only for files this node wrote itself.

    Raises:
        RequestTimeout: the reply was not written within its deadlines (the caller resets the stream).
        StreamClosed: the stream went away (or the file shrank) mid-reply.
    """
    try:
        size = await trio.to_thread.run_sync(size_of, path, limit)
        async with budget.reserve(peer, min(STREAM_HOLD, size + MAX_PREFIX)):
            f, size = await trio.to_thread.run_sync(open_sized, path, limit)
            with f:
                await write_file_msg(stream, f, size, {"status": "ok", **(fields or {})}, key=key,
                                     timeout=timeout, stall=stall, raw=raw)
    except RemoteError as e:  # not_found, too_large, busy: nothing of the reply was written yet
        await write_error(stream, e.code, e.message)
