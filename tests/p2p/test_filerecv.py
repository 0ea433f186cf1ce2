"""Receiving a file reply into a file as its frames arrive (node.p2p.filerecv), on in-memory streams: the same wire
as write_msg / write_file_msg, a bin over the limit refused from its header, malformed heads and lengths refused,
and the memory of a 16 MiB reply bounded by a frame or two (tracemalloc)."""

from __future__ import annotations

import io
import os
import tracemalloc

import pytest

from node.encoding import MAX_FRAME, pack
from node.p2p.filerecv import read_file_msg
from node.p2p.filesend import write_file_msg
from node.p2p.framing import FrameError, StreamClosed, encode_frames, error_reply, write_msg

from .util import FakeStream, run

MiB = 1 << 20


def wire_of_file(data: bytes, fields: dict) -> bytes:
    async def body():
        s = FakeStream()
        await write_file_msg(s, io.BytesIO(data), len(data), fields)
        return bytes(s.written)

    return run(body)


def receive(wire: bytes, max_size: int = 64 * MiB, key: str = "data"):
    async def body():
        s = FakeStream(wire, chunk=1 << 16)
        out = io.BytesIO()
        reply = await read_file_msg(s, out, key=key, max_size=max_size, timeout=10)
        return reply, out.getvalue(), s

    return run(body)


@pytest.mark.parametrize("size", [0, 1, 70_000, MAX_FRAME - 20, MAX_FRAME, 3 * MAX_FRAME + 123])
def test_roundtrip_with_write_file_msg(size):
    data = os.urandom(size)
    reply, got, _ = receive(wire_of_file(data, {"status": "ok", "index": 3}))
    assert got == data and reply == {"status": "ok", "index": 3, "data": size}


def test_write_msg_replies_too_with_fields_after_the_bin():
    data = os.urandom(2 * MAX_FRAME + 5)
    wire = b"".join(encode_frames({"data": data, "status": "ok", "n": [1, 2]}))  # set_request_handler's order
    reply, got, _ = receive(wire)
    assert got == data and reply == {"status": "ok", "n": [1, 2], "data": len(data)}

    async def err():
        s = FakeStream()
        await write_msg(s, error_reply("busy", "try later"))
        return bytes(s.written)

    reply, got, _ = receive(run(err))
    assert got == b"" and reply["code"] == "busy" and "data" not in reply


def test_over_the_limit_is_refused_from_its_header():
    wire = wire_of_file(b"x" * (3 * MAX_FRAME), {"status": "ok"})
    with pytest.raises(FrameError, match="over"):
        receive(wire, max_size=2 * MAX_FRAME)
    with pytest.raises(FrameError, match="over"):  # one frame too
        receive(wire_of_file(b"y" * 100, {"status": "ok"}), max_size=99)


def test_malformed_replies_are_refused():
    big = b"z" * (MAX_FRAME + 10)
    not_bin = b"".join(encode_frames({"status": "ok", "data": "s" * (MAX_FRAME + 10)}))
    with pytest.raises(FrameError, match="not a bin"):
        receive(not_bin)
    no_key = b"".join(encode_frames({"status": "ok", "blob": big}))
    with pytest.raises(FrameError):
        receive(no_key)
    wire = wire_of_file(big, {"status": "ok"})
    with pytest.raises(StreamClosed):
        receive(wire[:-7])  # cut short
    # a bin that declares fewer bytes than its frames carry: the surplus is not small fields
    frames = bytearray(wire)
    at = frames.index(b"\xc6")
    frames[at + 1:at + 5] = (len(big) - 1000).to_bytes(4, "big")
    with pytest.raises(FrameError):
        receive(bytes(frames))
    lying = pack({"status": "ok"})[:-3]
    with pytest.raises(FrameError):
        receive(b"".join(encode_frames({"x": 1}))[:0] + bytes([0, 0, 0, len(lying), 0]) + lying)


class ViewStream:
    """Serves ``data`` in reads of at most ``chunk`` bytes without copying or shrinking it (so tracemalloc sees
    only what the reader allocates)."""

    def __init__(self, data: bytes, chunk: int):
        self.view, self.pos, self.chunk = memoryview(data), 0, chunk

    async def read(self, n: int) -> bytes:
        out = bytes(self.view[self.pos:self.pos + min(n, self.chunk)])
        self.pos += len(out)
        return out


def test_memory_is_a_frame_or_two_not_the_file():
    data = os.urandom(16 * MiB)
    wire = wire_of_file(data, {"status": "ok"})

    async def body(path):
        s = ViewStream(wire, chunk=1 << 16)
        with open(path, "wb") as f:
            tracemalloc.start()
            try:
                reply = await read_file_msg(s, f, max_size=32 * MiB, timeout=30)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        return reply, peak

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f")
        reply, peak = run(body, path, timeout=60)
        with open(path, "rb") as f:
            assert f.read() == data
    assert reply["data"] == len(data)
    print(f"peak {peak / MiB:.2f} MiB traced while receiving a 16 MiB file reply")
    assert peak < 4 * MiB
