"""read_msg refuses a message at the frame header that takes it past ``max_message``, before reading that frame
(issue 35, check 2: with that check removed from read_msg, tests/p2p, the hello and node limits tests and the
hostile-peer suite's post-hello bombs all still passed, because the decoder's own ``max_size`` refuses the message
too, but only after the reader has waited for and buffered all of it)."""

import struct

import pytest

from node.encoding import pack
from node.p2p.framing import FrameError, read_msg

from .util import FakeStream, run

MORE = 1


def header(length: int, more: bool) -> bytes:
    return struct.pack(">IB", length, MORE if more else 0)


@pytest.mark.parametrize("sizes", [(400, 400, 400), (400, 700), (1001,)])
def test_a_message_growing_past_max_message_is_refused_at_the_header_that_crosses_it(sizes):
    """max_message = 1000: the frame header that would take the message past 1000 bytes is refused at once; its
    payload, which the peer never sends (the stream ends after that header), is not waited for."""
    async def body():
        *full, crossing = sizes
        sent = b"".join(header(n, True) + b"a" * n for n in full) + header(crossing, False)
        s = FakeStream(sent, chunk=1 << 16)
        with pytest.raises(FrameError, match="exceeds limit of 1000 bytes"):
            await read_msg(s, timeout=5, max_message=1000)

    run(body)


def test_a_message_of_exactly_max_message_bytes_is_read():
    async def body():
        data = pack({"b": b"x" * 100})
        half = len(data) // 2
        s = FakeStream(header(half, True) + data[:half] + header(len(data) - half, False) + data[half:], chunk=7)
        assert await read_msg(s, timeout=5, max_message=len(data)) == {"b": b"x" * 100}

    run(body)
