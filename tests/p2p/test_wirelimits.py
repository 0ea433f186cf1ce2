"""The wire-limit table (node.p2p.wirelimits), read_msg's per-protocol limits and the node-wide budget for large
reads, on in-memory streams that say which protocol they speak (no network)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
import trio

from node.encoding import MAX_FRAME, MAX_MESSAGE, pack
from node.p2p import wirelimits
from node.p2p.framing import (
    FrameError,
    ReadBusy,
    RemoteError,
    StreamClosed,
    check_reply,
    encode_frames,
    read_msg,
    write_msg,
)
from node.p2p.gossip import TOPIC_NAMES
from node.p2p.wirelimits import (
    DEFAULT,
    IN_PROCESS,
    LARGE_READ,
    READ_BUDGET,
    TABLE,
    ReadBudget,
    gossip_limit,
    limit_for,
    stream_limit,
)

from .util import FakeStream, run

NODE = Path(__file__).resolve().parents[2] / "node"
KIB, MIB = 1 << 10, 1 << 20


class Muxed:
    def __init__(self, initiator: bool):
        self.is_initiator = initiator


class ProtoStream(FakeStream):
    """An in-memory stream that answers ``get_protocol()`` like py-libp2p's ``NetStream`` (and, with
    ``initiator``, carries a muxed stream that says which side opened it)."""

    def __init__(self, data: bytes = b"", protocol: str | None = None, initiator: bool | None = None,
                 chunk: int = 1 << 20):
        super().__init__(data, chunk=chunk)
        self.protocol = protocol
        if initiator is not None:
            self.muxed_stream = Muxed(initiator)

    def get_protocol(self):
        return self.protocol


def test_every_protocol_constant_in_node_has_an_entry():
    """A protocol added later without a table entry fails here (it would otherwise get the 64 KiB default)."""
    found = {}
    for path in NODE.rglob("*.py"):
        for name, proto in re.findall(r'^(\w*PROTOCOL\w*)\s*=\s*"(/tally/[^"]+)"', path.read_text(), re.M):
            found[name] = proto
    assert len(found) >= 10, found  # hello, peers, dialback, inference, snapshot, sync, submit, block, batch, blob
    missing = {n: p for n, p in found.items() if p not in TABLE}
    assert not missing, f"add these protocols to node/p2p/wirelimits.py TABLE: {missing}"
    for name in TOPIC_NAMES:
        assert f"gossip/{name}" in TABLE


def test_small_default_and_opt_in_large_limits():
    assert DEFAULT.largest() <= 64 * KIB and limit_for("/tally/unknown/9.9.9") is DEFAULT and limit_for(None) is DEFAULT
    for proto in ("/tally/hello/1.0.0", "/tally/dialback/1.0.0"):  # served before the handshake: a few KiB
        assert TABLE[proto].largest() <= 8 * KIB and TABLE[proto].objects is not None
    assert TABLE["/tally/peers/1.0.0"].request <= KIB and TABLE["/tally/peers/1.0.0"].reply <= 64 * KIB
    for lim in TABLE.values():  # requests to bulk protocols are small; every entry bounds the decode cost
        assert lim.depth <= 32 and lim.cost_ratio <= 8 and lim.timeout > 0
        assert lim.largest() <= MAX_MESSAGE
    assert TABLE["/tally/block/1.0.0"].request <= 4 * KIB and TABLE["/tally/block/1.0.0"].reply >= 48 * MIB
    for proto in ("/tally/inference/2.0.0", "/tally/blob/1.0.0", "/tally/block/1.0.0", "/tally/batch/1.0.0"):
        assert TABLE[proto].cost_ratio <= 4 and TABLE[proto].objects is not None  # payloads are bytes
    assert gossip_limit("tally/test-chain/0011223344556677/tx") is TABLE["gossip/tx"]
    assert gossip_limit("tally/other/name") is DEFAULT


def test_stream_limit_follows_protocol_and_direction():
    hello = TABLE["/tally/hello/1.0.0"]
    sync = TABLE["/tally/sync/1.0.0"]
    assert stream_limit(ProtoStream(protocol="/tally/sync/1.0.0", initiator=True)) == (sync, sync.reply)
    assert stream_limit(ProtoStream(protocol="/tally/sync/1.0.0", initiator=False)) == (sync, sync.request)
    assert stream_limit(ProtoStream(protocol="/tally/sync/1.0.0")) == (sync, sync.largest())
    assert stream_limit(ProtoStream(protocol="/tally/hello/1.0.0", initiator=False)) == (hello, hello.request)
    assert stream_limit(ProtoStream(protocol="/x/1")) == (DEFAULT, DEFAULT.largest())
    assert stream_limit(ProtoStream(protocol=None)) == (DEFAULT, DEFAULT.largest())
    assert stream_limit(FakeStream()) == (IN_PROCESS, MAX_MESSAGE)  # no get_protocol: an in-process pipe


def test_read_msg_uses_the_protocols_limits():
    async def body():
        ok = {"chain_id": "c", "genesis": "00" * 32, "agent": "tally", "addrs": ["/ip4/1.2.3.4/tcp/1"] * 8}
        s = ProtoStream(b"".join(encode_frames(ok)), protocol="/tally/hello/1.0.0", initiator=False)
        assert await read_msg(s, timeout=5) == ok
        # a 9 KiB hello is refused at its frame header, before its payload is read
        s = ProtoStream(b"".join(encode_frames({"pad": b"x" * (9 * KIB)})), "/tally/hello/1.0.0", False)
        with pytest.raises(FrameError, match="limit"):
            await read_msg(s, timeout=5)
        assert s.read_sizes == [1 << 16]
        # the same message on a sync stream (a request there is at most 4 KiB; a reply may be large)
        big = {"blocks": [b"x" * 1000] * 9}
        with pytest.raises(FrameError):
            await read_msg(ProtoStream(b"".join(encode_frames(big)), "/tally/sync/1.0.0", False), timeout=5)
        assert await read_msg(ProtoStream(b"".join(encode_frames(big)), "/tally/sync/1.0.0", True),
                              timeout=5) == big
        # an explicit max_message wins over the table; the table's object and depth limits still apply
        assert await read_msg(ProtoStream(b"".join(encode_frames(big)), "/tally/hello/1.0.0", False),
                              timeout=5, max_message=16 * KIB) == big
        many = {"addrs": list(range(300))}  # 301 objects + 2: over hello's 256
        with pytest.raises(FrameError, match="objects"):
            await read_msg(ProtoStream(b"".join(encode_frames(many)), "/tally/hello/1.0.0", False), timeout=5)
        deep: object = 1
        for _ in range(5):
            deep = [deep]
        with pytest.raises(FrameError, match="deeper"):
            await read_msg(ProtoStream(b"".join(encode_frames({"a": deep})), "/tally/hello/1.0.0", False),
                           timeout=5)
        # a message of empty maps: 64 KiB of them would be ~4.5 MiB of dicts; refused by the decode cost
        bomb = b"\x81\xa1a\xdc\xff\xff" + b"\x80" * 65535
        frames = struct.pack(">IB", len(bomb), 0) + bomb
        with pytest.raises(FrameError, match="estimated"):
            await read_msg(ProtoStream(frames, "/tally/sync/1.0.0", True), timeout=5)

    run(body)


def _large_message(size: int) -> bytes:
    return b"".join(encode_frames({"data": b"\x00" * size}))


def test_large_reads_share_the_node_wide_pool():
    """Messages beyond LARGE_READ reserve their bytes as they grow; an empty pool refuses promptly (ReadBusy,
    a RemoteError with code busy) and every byte comes back, after success, refusal, EOF or a bad frame."""
    pool = READ_BUDGET
    before = pool.capacity

    async def body():
        pool.configure(3 * MIB)
        try:
            assert pool.full()
            small = ProtoStream(_large_message(LARGE_READ - 100), "/tally/sync/1.0.0", True)
            assert len((await read_msg(small, timeout=5))["data"]) == LARGE_READ - 100
            assert pool.full()  # under the threshold: nothing reserved

            # two large reads at once: the first holds its bytes while it waits for the rest of its frames
            first = ProtoStream(_large_message(2 * MIB)[: MAX_FRAME + 5 + 1000], "/tally/sync/1.0.0", True)
            gate = trio.Event()
            orig = first.read

            async def slow_read(n):
                if not first.data:
                    await gate.wait()
                return await orig(n)

            first.read = slow_read
            seen = []

            async def first_reader():
                try:
                    await read_msg(first, timeout=5)
                except StreamClosed as e:
                    seen.append(e)

            async with trio.open_nursery() as n:
                n.start_soon(first_reader)
                while pool.available == pool.capacity:
                    await trio.sleep(0.01)
                assert pool.available < pool.capacity
                second = ProtoStream(_large_message(2 * MIB), "/tally/sync/1.0.0", True)
                with pytest.raises(ReadBusy) as e:
                    await read_msg(second, timeout=5)
                assert isinstance(e.value, RemoteError) and e.value.code == "busy"
                assert len(second.data) > 900 * KIB  # refused at its second frame header, before its payload
                gate.set()
            assert len(seen) == 1 and pool.full()  # the first ended in EOF: its bytes came back

            # 100 aborted large reads (truncated, bad flags, not a map): the pool is full again after them
            bad_flags = _large_message(2 * MIB)
            cut = MAX_FRAME + 5 + 10
            bad_flags = bad_flags[:cut] + b"\x00\x00\x00\x10\x02" + b"x" * 16
            for i in range(100):
                data = [_large_message(2 * MIB)[: MAX_FRAME + 5 + 7 * i + 10], bad_flags,
                        b"".join(encode_frames([b"\x00" * (2 * MIB)]))][i % 3]
                with pytest.raises((StreamClosed, FrameError)):
                    await read_msg(ProtoStream(data, "/tally/sync/1.0.0", True), timeout=5)
                assert pool.full(), i
            assert len((await read_msg(ProtoStream(_large_message(2 * MIB), "/tally/sync/1.0.0", True),
                                       timeout=5))["data"]) == 2 * MIB
            assert pool.full()
        finally:
            pool.configure(before)

    run(body)


def test_read_budget_accounting():
    b = ReadBudget(10)
    assert b.take(6) and not b.take(5) and b.refused == 1 and b.available == 4
    b.configure(20)
    assert b.available == 14 and b.capacity == 20
    b.give(6)
    assert b.full()
    with pytest.raises(ValueError):
        b.configure(-1)
    assert wirelimits.READ_POOL == 256 * MIB and LARGE_READ == MIB


def test_gossip_validator_refuses_oversized_payloads():
    from node.p2p.gossip import _topic_validator

    class Msg:
        def __init__(self, data: bytes):
            self.data = data
            self.from_id = b"\x00"

    check = _topic_validator("tally/c/tx", None)
    assert check(None, Msg(b"x" * (64 * KIB)))
    assert not check(None, Msg(b"x" * (64 * KIB + 1)))
    seen = []
    check = _topic_validator("tally/c/shards", lambda data, origin: seen.append(data) or True)
    assert not check(None, Msg(pack({"x": b"y" * (16 * KIB)})))
    assert not seen  # refused before the application's validator ran


def test_real_streams_know_their_protocol_and_direction():
    """On py-libp2p streams the server side reads requests and the opener reads replies, by the table."""
    from .util import running_hosts

    sync = TABLE["/tally/sync/1.0.0"]
    seen = []

    async def handler(stream, remote):
        seen.append(stream_limit(stream))
        msg = await read_msg(stream)  # the table's request limit and timeout
        await write_msg(stream, {"status": "ok", "blocks": [b"x" * (8 * KIB)], "echo": msg})

    async def body():
        async with running_hosts(2) as (a, b):
            b.set_handler("/tally/sync/1.0.0", handler)
            assert await a.connect(b.addrs) == 1
            s = await a.open_stream(b.peer_id, "/tally/sync/1.0.0")
            assert stream_limit(s) == (sync, sync.reply)
            await write_msg(s, {"from": 1})
            reply = await read_msg(s)  # 8 KiB: over the request limit, within the reply limit
            assert reply["echo"] == {"from": 1} and seen == [(sync, sync.request)]
            await s.close()
            # a request over the server's 4 KiB is refused there (bad_frame), before it is decoded
            s = await a.open_stream(b.peer_id, "/tally/sync/1.0.0")
            await write_msg(s, {"from": 1, "pad": b"x" * (5 * KIB)})
            with pytest.raises(RemoteError) as e:
                check_reply(await read_msg(s))
            assert e.value.code == "bad_frame"

    run(body)


def test_pubsub_bounds_inbound_rpcs():
    """py-libp2p reads one pubsub RPC of at most 1 MiB (its default, kept): above every gossip entry."""
    from .util import running_hosts

    async def body():
        async with running_hosts(1) as (a,):
            cap = a._gossip._pubsub.max_inbound_rpc_size
            assert cap <= MIB
            assert all(TABLE[f"gossip/{t}"].request < cap for t in TOPIC_NAMES)

    run(body)


def test_markdown_table_lists_every_entry():
    text = wirelimits.markdown_table()
    assert all(f"`{name}`" in text for name in TABLE) and "| `/tally/hello/1.0.0` | 8 KiB | 8 KiB | 256 |" in text


def test_a_cancelled_large_read_gives_its_bytes_back():
    """Cancellation (the caller's deadline, a host shutting down) mid-message returns the reservation too."""

    class Stalls(ProtoStream):
        async def read(self, n):
            if not self.data:
                await trio.sleep_forever()
            return await super().read(n)

    async def body():
        s = Stalls(_large_message(3 * MIB)[: 2 * (MAX_FRAME + 5)], "/tally/sync/1.0.0", True)
        async with trio.open_nursery() as n:
            n.start_soon(read_msg, s, 30)
            with trio.fail_after(5):
                while READ_BUDGET.full():  # the second frame's header reserved 2 MiB
                    await trio.sleep(0.01)
            assert READ_BUDGET.capacity - READ_BUDGET.available >= 2 * MIB
            n.cancel_scope.cancel()
        assert READ_BUDGET.full()

    run(body)


def test_read_budget_caps_what_one_peer_holds_and_forgets_a_peer_at_zero():
    """One peer's large reads hold at most ``per_peer`` of the pool, so a peer dripping big messages on many
    streams leaves room for the others; a peer's entry goes when its bytes come back."""
    b = ReadBudget(100, per_peer=40)
    assert b.take(30, "a") and b.take(10, "a") and not b.take(1, "a")  # a's share is full
    assert b.refused == 1 and b.available == 60
    assert b.take(40, "b") and b.take(20) and b.available == 0  # others (and peerless reads) still had room
    b.give(30, "a")
    b.give(10, "a")
    assert "a" not in b.held and b.held == {"b": 40}
    b.give(40, "b")
    b.give(20)
    assert b.full() and b.held == {}
    with pytest.raises(ValueError):
        b.configure(10, per_peer=-1)
