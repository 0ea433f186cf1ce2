"""Streaming a file reply from disk in frames (node.p2p.filesend) on in-memory streams: the bytes are what
write_msg would have written for the same map, the reader is unchanged, a stalled reader is cut at the deadline
and its budget comes back, and errors are plain replies."""

import os

import pytest
import trio

from node.encoding import MAX_FRAME
from node.p2p.budget import ReplyBudget
from node.p2p.filesend import STREAM_HOLD, file_prefix, serve_file, write_file_msg
from node.p2p.framing import RemoteError, RequestTimeout, check_reply, encode_frames, read_msg

from .util import FakeStream, run


@pytest.mark.parametrize("size", [0, 1, 70_000, MAX_FRAME - 20, MAX_FRAME, 3 * MAX_FRAME + 123])
def test_same_bytes_as_write_msg(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    fields = {"status": "ok", "index": 7}

    async def body():
        s = FakeStream(chunk=1 << 16)
        with open(path, "rb") as f:
            n = await write_file_msg(s, f, size, fields)
        assert n == len(s.written)
        if size >= 1 << 16:  # msgpack packs such a bin as bin 32 too: the very same frames
            assert bytes(s.written) == b"".join(encode_frames({**fields, "data": data}))
        s.data = s.written
        assert await read_msg(s, timeout=5) == {**fields, "data": data}

    run(body)


def test_prefix_checks():
    assert file_prefix(5, {"a": 1}) == b"\x82\xa1a\x01\xa4data\xc6\x00\x00\x00\x05"
    assert file_prefix(5, {"a": 1}, key="t", raw=True) == b"\x82\xa1a\x01\xa1t"  # the file is the value itself
    with pytest.raises(ValueError):
        file_prefix(1 << 32)
    with pytest.raises(ValueError):
        file_prefix(1, {"data": 1})
    with pytest.raises(ValueError):
        file_prefix(1, {"x": b"y" * (1 << 17)})


class StuckStream(FakeStream):
    """A reader that never reads: every write after the first ``ok`` bytes blocks forever."""

    def __init__(self, ok: int):
        super().__init__()
        self.ok = ok

    async def write(self, b: bytes) -> None:
        if len(self.written) + len(b) > self.ok:
            await trio.sleep_forever()
        await super().write(b)


def test_stalled_reader_is_cut_and_budget_returns(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * (4 * MAX_FRAME))
    budget = ReplyBudget(per_peer=8 * MAX_FRAME, node_wide=8 * MAX_FRAME, wait=0)

    async def body():
        s = StuckStream(ok=MAX_FRAME + 100)
        t0 = trio.current_time()
        held = []

        async def watch():
            await trio.sleep(0.1)
            held.append(budget.held_by("p"))

        async with trio.open_nursery() as n:
            n.start_soon(watch)
            with pytest.raises(RequestTimeout):
                await serve_file(s, "p", path, limit=8 * MAX_FRAME, budget=budget, stall=0.5)
        assert held == [STREAM_HOLD]  # held while it writes
        assert 0.4 < trio.current_time() - t0 < 5
        assert budget.whole()

    run(body)


def test_errors_are_replies(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 100)
    budget = ReplyBudget(per_peer=MAX_FRAME, node_wide=MAX_FRAME, wait=0)

    async def reply(path, peer="p"):
        s = FakeStream(chunk=1 << 16)
        await serve_file(s, peer, path, limit=50, budget=budget)
        s.data = s.written
        return await read_msg(s, timeout=5)

    async def body():
        with pytest.raises(RemoteError) as e:
            check_reply(await reply(tmp_path / "missing"))
        assert e.value.code == "not_found"
        with pytest.raises(RemoteError) as e:
            check_reply(await reply(tmp_path / "big"))
        assert e.value.code == "too_large"
        small = tmp_path / "small"
        small.write_bytes(b"y" * 10)
        r = budget.try_reserve("p", MAX_FRAME)  # the peer's budget is full
        with pytest.raises(RemoteError) as e:
            check_reply(await reply(small))
        assert e.value.code == "busy"
        budget.release(r)
        assert check_reply(await reply(small))["data"] == b"y" * 10
        assert budget.whole()

    run(body)
