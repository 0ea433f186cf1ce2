"""Length-prefixed msgpack messages over a libp2p stream (DESIGN.md, "Runtime").

Wire format of one *frame*::

    length : 4 bytes, big-endian unsigned, payload length in bytes (flag byte not included), <= MAX_FRAME
    flags  : 1 byte; bit 0 = "more frames follow" (MORE); every other bit must be 0
    payload: ``length`` bytes

A *message* is the concatenation of the payloads of one or more frames, the last of which has MORE clear.
A non-final frame must carry at least one byte (so a peer cannot spin the reader with empty frames). The
reassembled bytes (at most ``max_message`` bytes) are decoded with :func:`node.encoding.unpack` and must be a
msgpack map.

Reply convention for request/response protocols: every reply is a map with ``"status": "ok"`` plus fields, or
``"status": "error", "code": str, "message": str``. Build replies with :func:`ok_reply` /
:func:`error_reply`; check them with :func:`check_reply`, which raises :class:`RemoteError`.

py-libp2p reports a remote reset as plain EOF, so EOF before a complete message is always
:class:`StreamClosed`, never an empty success.
"""

from __future__ import annotations

import math
import struct
import weakref
from typing import Any, Protocol

import trio

from ..encoding import MAX_FRAME, MAX_MESSAGE, DecodeError, pack, unpack
from .wirelimits import LARGE_READ, READ_BUDGET, stream_limit

HEADER = struct.Struct(">IB")  # length (u32 BE), flags (u8)
HEADER_LEN = HEADER.size  # 5 bytes
MORE = 0x01  # flag bit 0: more frames follow
STATS = {"sent": 0, "received": 0}  # bytes of framed messages written and read by this process (for /metrics)

__all__ = [
    "HEADER_LEN",
    "MAX_FRAME",
    "MAX_MESSAGE",
    "MORE",
    "ByteReader",
    "ByteWriter",
    "FrameError",
    "ReadBusy",
    "RemoteError",
    "RequestTimeout",
    "StreamClosed",
    "check_reply",
    "encode_frames",
    "error_reply",
    "ok_reply",
    "read_msg",
    "write_msg",
]


class ByteReader(Protocol):
    """What :func:`read_msg` reads from: a libp2p ``INetStream`` or an in-process pipe."""

    async def read(self, n: int, /) -> bytes:
        """What has arrived, at most ``n`` bytes; ``b""`` at EOF."""
        ...


class ByteWriter(Protocol):
    """What :func:`write_msg` writes to: a libp2p ``INetStream`` or an in-process pipe."""

    async def write(self, data: bytes, /) -> None:
        """Write all of ``data``."""
        ...


class StreamClosed(Exception):
    """The stream ended (EOF, reset or closed) before a complete message was read or written."""


class FrameError(Exception):
    """The peer broke the framing rules: oversized frame or message, bad flags, malformed msgpack, not a map,
    or a reply without a valid ``status``."""


class RequestTimeout(Exception):
    """A read or write did not finish within its deadline (raised from ``trio.TooSlowError``)."""


class RemoteError(Exception):
    """The remote answered with ``"status": "error"``. ``.code`` is its machine-readable code (str) and
    ``.message`` its human-readable text."""

    def __init__(self, code: str, message: str = ""):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class ReadBusy(RemoteError):
    """This node's pool for large reads (:data:`node.p2p.wirelimits.READ_BUDGET`) has no room for a message
    now; code ``busy``. Nothing was allocated for it; the stream is out of step (reset it). Not the peer's fault:
    no penalty."""

    def __init__(self, message: str):
        super().__init__("busy", message)


_IO_ERRORS: tuple[type[BaseException], ...] | None = None


def _io_errors() -> tuple[type[BaseException], ...]:
    """Exception types a stream raises when it or its connection goes away: py-libp2p's, where it is installed
    (framing also runs over in-memory streams, e.g. on a GPU box with no libp2p), plus the standard ones."""
    global _IO_ERRORS
    if _IO_ERRORS is None:
        errors: tuple[type[BaseException], ...] = (EOFError, ConnectionError, trio.BrokenResourceError,
                                                   trio.ClosedResourceError)
        try:
            # local: optional here (in-memory streams run without it) and ~1.3 s to import
            from libp2p.exceptions import BaseLibp2pError
            from libp2p.io.exceptions import IOException
            from libp2p.stream_muxer.exceptions import MuxedStreamError
        except ImportError:
            pass
        else:
            errors = (IOException, MuxedStreamError, BaseLibp2pError) + errors
        _IO_ERRORS = errors
    return _IO_ERRORS


def encode_frames(obj: Any, max_message: int = MAX_MESSAGE) -> list[bytes]:
    """Encode ``obj`` as a list of wire frames (header + payload each), each payload <= MAX_FRAME bytes.

    Raises:
        FrameError: the packed message is larger than ``max_message`` bytes.
        TypeError: ``obj`` holds something msgpack cannot encode.
    """
    data = pack(obj)
    if len(data) > max_message:
        raise FrameError(f"message of {len(data)} bytes exceeds limit {max_message}")
    frames = []
    view = memoryview(data)
    off = 0
    while True:
        chunk = view[off:off + MAX_FRAME]
        off += len(chunk)
        more = off < len(data)
        frames.append(HEADER.pack(len(chunk), MORE if more else 0) + bytes(chunk))
        if not more:
            return frames


async def write_msg(stream: ByteWriter, obj: Any, timeout: float | None = None, max_message: int = MAX_MESSAGE) -> None:
    """Write one message (split into frames of at most MAX_FRAME payload bytes) to ``stream``.

    Args:
        stream: a libp2p ``INetStream`` (anything with ``async write(bytes)``).
        obj: a msgpack-encodable object; by convention a map.
        timeout: seconds for the whole write (``None``: no deadline; a write only blocks while the peer's
            receive window is full).
        max_message: largest packed size accepted, in bytes.

    Raises:
        FrameError: the message is larger than ``max_message``.
        StreamClosed: the stream was closed or reset.
        RequestTimeout: ``timeout`` elapsed.
    """
    frames = encode_frames(obj, max_message)
    errors = _io_errors()
    try:
        with trio.fail_after(math.inf if timeout is None else timeout):
            for f in frames:
                await stream.write(f)
                STATS["sent"] += len(f)
    except trio.TooSlowError:
        raise RequestTimeout(f"write did not finish within {timeout} s") from None
    except errors as e:
        raise StreamClosed(f"stream closed while writing: {type(e).__name__}: {e}") from None


READ_CHUNK = 1 << 16  # bytes asked of the stream per read: whatever has arrived, up to this
# stream -> bytes read past a message
_LEFTOVER: weakref.WeakKeyDictionary[ByteReader, bytearray] = weakref.WeakKeyDictionary()


async def _fill(stream: ByteReader, buf: bytearray, n: int, errors: tuple[type[BaseException], ...],
                exact: bool) -> None:
    """Read from ``stream`` into ``buf`` until it holds at least ``n`` bytes. ``stream.read(k)`` returns what has
    arrived (up to ``k``), so one read usually brings a whole frame, often the next message too: what is read
    past the current message stays in the stream's buffer for the next :func:`read_msg` (half the reads, and
    half of py-libp2p's per-read cost, of reading header and payload separately). ``exact``: never read past
    ``n`` (a stream whose leftover cannot be kept). EOF before ``n`` -> StreamClosed."""
    while len(buf) < n:
        try:
            chunk = await stream.read(n - len(buf) if exact else max(READ_CHUNK, n - len(buf)))
        except errors as e:
            raise StreamClosed(f"stream ended with {len(buf)} of {n} bytes buffered: {type(e).__name__}") from None
        if not chunk:
            raise StreamClosed(f"EOF with {len(buf)} of {n} bytes buffered")
        buf += chunk


async def read_msg(stream: ByteReader, timeout: float | None = None,
                   max_message: int | None = None) -> dict[str, Any]:
    """Read one message from ``stream`` and decode it, within the limits of the stream's protocol.

    Args:
        stream: a libp2p ``INetStream`` (anything with ``async read(n) -> bytes``).
        timeout: seconds allowed for the whole message (all of its frames); every read runs under this one
            ``trio.fail_after`` deadline, so a peer cannot keep the reader alive by dripping bytes. Size it to
            the largest message expected (~54 MB/s across processes on loopback). ``None``: the protocol's
            read timeout (:mod:`node.p2p.wirelimits`).
        max_message: largest reassembled size accepted, in bytes. ``None``: the limit of the stream's protocol
            and direction in :data:`node.p2p.wirelimits.TABLE` (a request on a stream this node accepted, a
            reply on one it opened), 64 KiB for a protocol missing from the table. The entry's depth, object
            and decode-cost limits apply either way.

    Returns:
        The decoded msgpack map.

    A message that grows beyond ``wirelimits.LARGE_READ`` (1 MiB) reserves its bytes frame by frame from the
    node-wide :data:`~node.p2p.wirelimits.READ_BUDGET` before reading them, and gives them back when it is
    decoded or its read fails.

    Raises:
        StreamClosed: EOF, reset or close before the message was complete.
        FrameError: a frame declares more than MAX_FRAME bytes (checked before allocating), bad flag bits,
            an empty non-final frame, a reassembled size over ``max_message``, malformed msgpack, msgpack
            nested too deep, holding too many objects or too costly to decode
            (:class:`~node.msgscan.DecodeError`), or a payload that is not a map.
        ReadBusy: the node-wide pool for large reads has no room for this message now.
        RequestTimeout: ``timeout`` elapsed.

    After any of these errors the stream is out of step with the peer (part of a message may have been
    consumed): reset or close it, never read it again.
    """
    lim, limit = stream_limit(stream)
    if max_message is None:
        max_message = limit
    if timeout is None:
        timeout = lim.timeout
    errors = _io_errors()
    try:
        buf, exact = _LEFTOVER.setdefault(stream, bytearray()), False
    except TypeError:  # not weak-referenceable: nowhere to keep a leftover, so read exactly what is needed
        buf, exact = bytearray(), True
    data = bytearray()  # one buffer for every frame's payload (a list of many tiny frames would cost ~50 B each)
    held = 0  # bytes reserved from READ_BUDGET for this message
    peer = _stream_peer(stream)  # whose share of READ_BUDGET it counts against (None: an in-process pipe)
    try:
        try:
            with trio.fail_after(timeout):
                while True:
                    await _fill(stream, buf, HEADER_LEN, errors, exact)
                    length, flags = HEADER.unpack_from(buf)
                    if flags & ~MORE:
                        raise FrameError(f"unknown frame flags 0x{flags:02x}")
                    if length > MAX_FRAME:
                        raise FrameError(f"frame declares {length} bytes, limit is {MAX_FRAME}")
                    size = len(data) + length
                    if size > max_message:
                        raise FrameError(f"message exceeds limit of {max_message} bytes")
                    if flags & MORE and length == 0:
                        raise FrameError("empty non-final frame")
                    if size > LARGE_READ and size > held:
                        if not READ_BUDGET.take(size - held, peer):
                            raise ReadBusy(f"no room for a message of {size} bytes in the node-wide read "
                                           f"budget ({READ_BUDGET.available} of {READ_BUDGET.capacity} bytes "
                                           f"free, {READ_BUDGET.held.get(peer or '', 0)} held by this peer of "
                                           f"{READ_BUDGET.per_peer}); try again later")
                        held = size
                    await _fill(stream, buf, HEADER_LEN + length, errors, exact)
                    data += buf[HEADER_LEN:HEADER_LEN + length]
                    del buf[:HEADER_LEN + length]
                    STATS["received"] += HEADER_LEN + length
                    if not flags & MORE:
                        break
        except trio.TooSlowError:
            raise RequestTimeout(f"no complete message within {timeout} s") from None
        try:
            obj = unpack(data, max_size=max_message, max_depth=lim.depth, cost_ratio=lim.cost_ratio,
                         max_objects=lim.objects)
        except DecodeError as e:
            raise FrameError(str(e)) from None
    finally:
        if held:
            READ_BUDGET.give(held, peer)
    if not isinstance(obj, dict):
        raise FrameError(f"message is a {type(obj).__name__}, expected a map")
    return obj


def _stream_peer(stream: Any) -> str | None:
    """The remote peer ID of a libp2p stream (``stream.muxed_conn.peer_id``), None for anything else."""
    try:
        return str(stream.muxed_conn.peer_id)
    except AttributeError:
        return None


def ok_reply(**fields: Any) -> dict[str, Any]:
    """A success reply: ``{"status": "ok", **fields}``."""
    return {"status": "ok", **fields}


def error_reply(code: str, message: str) -> dict[str, Any]:
    """An error reply: ``{"status": "error", "code": code, "message": message}``."""
    return {"status": "error", "code": str(code), "message": str(message)}


def check_reply(msg: dict[str, Any]) -> dict[str, Any]:
    """Return ``msg`` if it is an ``ok`` reply.

    Raises:
        RemoteError: ``msg["status"] == "error"`` (``.code`` from ``msg["code"]``, ``"unknown"`` if absent).
        FrameError: ``msg`` is not a map or has no valid ``status``.
    """
    if not isinstance(msg, dict):
        raise FrameError("reply is not a map")
    status = msg.get("status")
    if status == "ok":
        return msg
    if status == "error":
        code = msg.get("code")
        message = msg.get("message")
        raise RemoteError(code if isinstance(code, str) else "unknown",
                          message if isinstance(message, str) else "")
    raise FrameError(f"reply has invalid status {status!r}")
