"""Framing unit tests on an in-memory stream (no network)."""

import struct

import pytest
import trio

from node.encoding import MAX_FRAME, pack
from node.p2p.framing import (
    READ_CHUNK,
    FrameError,
    RemoteError,
    RequestTimeout,
    StreamClosed,
    check_reply,
    encode_frames,
    error_reply,
    ok_reply,
    read_msg,
    write_msg,
)

from .util import FakeStream, run


def frame(payload: bytes, more: bool = False) -> bytes:
    return struct.pack(">IB", len(payload), 1 if more else 0) + payload


def test_roundtrip_small_and_multiframe():
    big = {"blob": bytes(range(256)) * (10 * 1024), "n": 1}  # 2.5 MiB -> 3 frames

    async def body():
        for msg in ({"a": 1, "b": [1, 2, "x"], "c": b"\x00\x01"}, big):
            s = FakeStream(chunk=70_000)  # reads return short counts: the reader must loop
            await write_msg(s, msg)
            s.data = s.written
            assert await read_msg(s, timeout=5) == msg
            assert not s.data

    run(body)


def test_encode_frames_split():
    frames = encode_frames({"blob": b"x" * (2 * MAX_FRAME + 10)})
    assert len(frames) == 3
    for f in frames[:-1]:
        assert struct.unpack(">IB", f[:5]) == (MAX_FRAME, 1)
    n, flags = struct.unpack(">IB", frames[-1][:5])
    assert flags == 0 and 0 < n <= MAX_FRAME


def test_huge_declared_length_rejected_before_allocating():
    async def body():
        s = FakeStream(b"\xff\xff\xff\xff\x00" + b"x" * 100, chunk=1000)
        with pytest.raises(FrameError):
            await read_msg(s, timeout=5)
        assert s.read_sizes == [READ_CHUNK]  # one bounded read, refused at the header; nothing of the declared size

    run(body)


def test_messages_that_arrive_together_are_read_one_at_a_time():
    """A read brings whatever has arrived; bytes past one message wait, per stream, for the next read_msg."""
    msgs = [{"type": "ack", "steps": i, "sig": bytes(64)} for i in range(5)] + [{"blob": b"y" * 200_000}]

    async def body():
        data = b"".join(f for m in msgs for f in encode_frames(m))
        s, other = FakeStream(data, chunk=1 << 20), FakeStream(frame(pack({"other": 1})))
        for i, m in enumerate(msgs):
            assert await read_msg(s, timeout=5) == m
            if i == 0:  # each stream has its own leftover
                assert await read_msg(other, timeout=5) == {"other": 1}
        assert len(s.read_sizes) < len(msgs)  # fewer reads than messages: the acks came in one read
        with pytest.raises(StreamClosed):
            await read_msg(s, timeout=5)

    run(body)


def test_stream_without_weakref_reads_exactly_one_message():
    class Slotted:
        __slots__ = ("data",)

        def __init__(self, data):
            self.data = data

        async def read(self, n):
            out, self.data = self.data[:n], self.data[n:]
            return out

    async def body():
        s = Slotted(b"".join(encode_frames({"a": 1}) + encode_frames({"b": 2})))
        assert await read_msg(s, timeout=5) == {"a": 1}
        assert await read_msg(s, timeout=5) == {"b": 2}  # nothing of the second message was lost

    run(body)


def test_reassembled_limit():
    async def body():
        data = b"".join(encode_frames({"blob": b"x" * (MAX_FRAME + 100)}))
        with pytest.raises(FrameError):
            await read_msg(FakeStream(data, chunk=1 << 20), timeout=5, max_message=MAX_FRAME)
        assert await read_msg(FakeStream(data, chunk=1 << 20), timeout=5, max_message=2 * MAX_FRAME)

    run(body)


def test_truncated_and_empty_are_stream_closed():
    async def body():
        full = frame(pack({"k": "v" * 50}))
        for cut in (0, 3, 5, len(full) - 1):
            with pytest.raises(StreamClosed):
                await read_msg(FakeStream(full[:cut]), timeout=5)
        # a first frame announcing more frames, then EOF
        with pytest.raises(StreamClosed):
            await read_msg(FakeStream(frame(b"\x81", more=True)), timeout=5)

    run(body)


def test_bad_payloads_are_frame_errors():
    async def body():
        cases = [
            frame(b"\xc1"),  # never-used msgpack byte
            frame(pack({"a": 1}) + b"\x00"),  # trailing data
            frame(pack([1, 2, 3])),  # not a map
            frame(pack({"a": 1}))[:4] + b"\x02" + pack({"a": 1}),  # unknown flag bit
            frame(b"", more=True) + frame(pack({"a": 1})),  # empty non-final frame
            frame(b"\xdf\xff\xff\xff\xff"),  # map declaring 4G entries
        ]
        for data in cases:
            with pytest.raises(FrameError):
                await read_msg(FakeStream(data, chunk=100), timeout=5)

    run(body)


def test_read_timeout():
    class Silent:
        async def read(self, n):
            await trio.sleep_forever()

    async def body():
        t = trio.current_time()
        with pytest.raises(RequestTimeout):
            await read_msg(Silent(), timeout=0.1)
        assert trio.current_time() - t < 1.0

    run(body)


def test_write_limit():
    async def body():
        with pytest.raises(FrameError):
            await write_msg(FakeStream(), {"b": b"x" * 2000}, max_message=1000)

    run(body)


def test_reply_helpers():
    assert check_reply(ok_reply(x=1)) == {"status": "ok", "x": 1}
    with pytest.raises(RemoteError) as ei:
        check_reply(error_reply("not_found", "no such span"))
    assert ei.value.code == "not_found" and ei.value.message == "no such span"
    for bad in ({}, {"status": "maybe"}, [1]):
        with pytest.raises(FrameError):
            check_reply(bad)


def test_port_probe_follows_the_hosts_address_family():
    import socket

    from node.p2p.quirks import check_port_free

    check_port_free("127.0.0.1", 0)
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    check_port_free("::1", 0)
    check_port_free("[::1]", 0)
