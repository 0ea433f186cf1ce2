"""The receiving side of :mod:`node.p2p.filesend`: a reply whose bulk is one bin is written to a file as its
frames arrive, never held whole in memory (issue 23, "Budgets for bulk replies").

:func:`~node.p2p.framing.read_msg` reassembles a whole message in memory and unpacks it, which holds a 48 MiB block
about three times (the frames' bytes, the copy msgpack decodes, the decoded bin). :func:`read_file_msg` reads the
same wire format (frames of :mod:`node.p2p.framing`: its ``HEADER`` and ``MORE``) but parses only the map's head
from the first frame: the fields before the file's key, then the bin header (``0xc4``/``0xc5``/``0xc6`` and its
length, checked against the caller's limit before a byte of it is read), and copies the bin's bytes to a file
frame by frame. Small fields may also follow the bin (``set_request_handler`` adds ``status`` after a handler's
fields): at most :data:`~node.p2p.filesend.MAX_PREFIX` bytes of them, decoded at the end. A message of one frame
(an error reply, a small file) is decoded whole, as ``read_msg`` would.
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

import msgpack
import trio

from ..encoding import MAX_FRAME, DecodeError, unpack
from .filesend import MAX_PREFIX
from .framing import HEADER, MORE, STATS, ByteReader, FrameError, RequestTimeout, StreamClosed, _io_errors

__all__ = ["read_file_msg"]

_BIN_HEADS = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # msgpack bin 8/16/32: bytes of the length that follows


async def _exact(stream: ByteReader, n: int, errors: tuple[type[BaseException], ...]) -> bytearray:
    """Exactly ``n`` bytes from ``stream`` (StreamClosed at EOF or reset)."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = await stream.read(n - len(buf))
        except errors as e:
            raise StreamClosed(f"stream ended with {len(buf)} of {n} bytes read: {type(e).__name__}") from None
        if not chunk:
            raise StreamClosed(f"EOF with {len(buf)} of {n} bytes read")
        buf += chunk
    return buf


async def _frame(stream: ByteReader, errors: tuple[type[BaseException], ...]) -> tuple[bytearray, bool]:
    """One frame's payload and whether more frames follow. Raises FrameError for a bad header."""
    length, flags = HEADER.unpack(await _exact(stream, HEADER.size, errors))
    if flags & ~MORE:
        raise FrameError(f"unknown frame flags 0x{flags:02x}")
    if length > MAX_FRAME:
        raise FrameError(f"frame declares {length} bytes, limit is {MAX_FRAME}")
    if flags & MORE and length == 0:
        raise FrameError("empty non-final frame")
    payload = await _exact(stream, length, errors) if length else bytearray()
    STATS["received"] += HEADER.size + length
    return payload, bool(flags & MORE)


def _unpacker() -> msgpack.Unpacker:
    return msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=MAX_PREFIX, max_str_len=MAX_PREFIX,
                            max_bin_len=MAX_PREFIX, max_array_len=1024, max_map_len=64, max_ext_len=0)


_MSGPACK_ERRORS = (msgpack.OutOfData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError, struct.error)


def _tail(data: bytes, entries: int, fields: dict[str, Any]) -> None:
    """Decode the ``entries`` small key/value pairs that follow the bin (``data``: all the bytes after it) into
    ``fields``. Raises FrameError."""
    up = _unpacker()
    up.feed(data)
    try:
        for _ in range(entries):
            k = up.unpack()
            if not isinstance(k, str) or k in fields:
                raise FrameError("a reply's keys are distinct strings")
            fields[k] = up.unpack()
        if up.tell() != len(data):
            raise FrameError("bytes after the end of the reply")
    except FrameError:
        raise
    except _MSGPACK_ERRORS as e:
        raise FrameError(f"a streamed reply's tail is not small fields: {type(e).__name__}: {e}") from None


def _head(payload: bytearray, key: str) -> tuple[dict[str, Any], int, int, int]:
    """``(fields, offset of the bin's bytes, bin length, entries after it)`` of a map with a bin ``key``, parsed
    from the first frame's ``payload`` alone. Raises FrameError."""
    up = _unpacker()
    up.feed(payload[:MAX_PREFIX])
    fields: dict[str, Any] = {}
    try:
        n = up.read_map_header()
        for i in range(n):
            k = up.unpack()
            if not isinstance(k, str):
                raise FrameError("a reply's keys are strings")
            if k == key:
                pos = up.tell()
                width = _BIN_HEADS.get(payload[pos]) if pos < len(payload) else None
                if width is None:
                    raise FrameError(f"{key!r} is not a bin")
                (size,) = struct.unpack(">" + {1: "B", 2: "H", 4: "I"}[width], payload[pos + 1:pos + 1 + width])
                return fields, pos + 1 + width, size, n - i - 1
            if k in fields:
                raise FrameError("a reply's keys are distinct strings")
            fields[k] = up.unpack()
    except FrameError:
        raise
    except _MSGPACK_ERRORS as e:
        raise FrameError(f"a streamed reply's head is not a map of small fields: {type(e).__name__}: {e}") from None
    raise FrameError(f"a multi-frame reply without {key!r}")


async def read_file_msg(stream: ByteReader, dest: BinaryIO, *, key: str = "data", max_size: int, timeout: float,
                        max_message: int = MAX_FRAME) -> dict[str, Any]:
    """Read one message from ``stream``; the bytes of its bin ``key`` go to ``dest`` as they arrive.

    Args:
        stream: a libp2p stream (``async read(n)``).
        dest: a file open for binary writing (written in a worker thread, a frame at a time).
        key: the map key of the file's bytes.
        max_size: the largest bin accepted, in bytes (checked against its declared length before reading it).
        timeout: seconds for the whole message.
        max_message: the largest message of one frame decoded whole (an error reply).

    Returns:
        The map's other fields, with ``key`` set to the number of bytes written to ``dest`` (absent when the reply
        has no such key, e.g. an error reply: check it with :func:`~node.p2p.framing.check_reply`).

    Raises:
        FrameError: bad frames, a head that is not a map of small fields with the bin last, a bin over
            ``max_size``, or a message longer or shorter than its bin says.
        StreamClosed: EOF or reset before the message was complete.
        RequestTimeout: ``timeout`` elapsed.
    """
    errors = _io_errors()
    try:
        with trio.fail_after(timeout):
            payload, more = await _frame(stream, errors)
            if not more:  # one frame: small enough to decode whole
                try:
                    obj = unpack(payload, max_size=max_message)
                except DecodeError as e:
                    raise FrameError(str(e)) from None
                if not isinstance(obj, dict):
                    raise FrameError(f"message is a {type(obj).__name__}, expected a map")
                data = obj.get(key)
                if isinstance(data, bytes):
                    if len(data) > max_size:
                        raise FrameError(f"{key!r} of {len(data)} bytes, over {max_size}")
                    await trio.to_thread.run_sync(dest.write, data)
                    obj[key] = len(data)
                return obj
            fields, off, size, entries = _head(payload, key)
            if size > max_size:
                raise FrameError(f"{key!r} declares {size} bytes, over {max_size}")
            left = size
            tail = bytearray()
            chunk = memoryview(payload)[off:]
            while True:
                part = chunk[:left]
                if part:
                    await trio.to_thread.run_sync(dest.write, part)
                    left -= len(part)
                tail += chunk[len(part):]
                if len(tail) > MAX_PREFIX or (tail and not entries):
                    raise FrameError(f"the message runs past its {size}-byte {key!r}")
                del chunk, part, payload
                if not more:
                    break
                payload, more = await _frame(stream, errors)
                chunk = memoryview(payload)
            if left:
                raise FrameError(f"the message ended {left} bytes short of its {size}-byte {key!r}")
            _tail(bytes(tail), entries, fields)
    except trio.TooSlowError:
        raise RequestTimeout(f"no complete message within {timeout} s") from None
    fields[key] = size
    return fields
