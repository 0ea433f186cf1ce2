"""Property-based fuzzing of every protocol Tally serves (issue 23, check 2), bounded in time.

(a) The decoder: random bytes, random valid msgpack of random shape and nested bombs give a value or a
    ``DecodeError``, never another exception, and never more memory than the decode budget.
(b) Every stream handler a real in-process node registers (validator + span server, tiny model): hypothesis
    messages (framed maps with the protocols' own keys and random values, framed garbage, unframed bytes,
    nested and length bombs) are written on real libp2p streams from a second host on 127.0.0.1 that passed the
    hello. Each must get a clean error reply, a valid answer or a closed/reset stream; afterwards the node still
    answers a normal request; and no handler logs an unhandled exception (ERROR records of ``node.*`` and
    ``tally.*`` loggers).
(c) The gossip handlers (tx, consensus, shards) get the same payloads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import tracemalloc

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from node.compute.model import make_tiny
from node.encoding import DecodeError, decode_budget, pack, unpack
from node.net.hello import HELLO_PROTOCOL
from node.p2p.framing import StreamClosed, read_msg
from node.p2p.host import P2PHost
from node.p2p.scoring import PeerScores
from node.runtime import Node

from ..e2e.swarm import node_config, tiny_genesis
from .util import hello_peer

# ---------------------------------------------------------------- strategies

KEYS = ["op", "type", "from", "count", "key", "root", "tx", "want", "addrs", "chain_id", "genesis", "agent",
        "snapshot", "index", "name", "file", "session", "step", "start", "end", "model", "hidden", "tokens",
        "status", "k", "b", "h", "data", "shape", "dtype", "id", "height", "sig", "terms", "compression"]
WORDS = ["get", "offer", "light", "chunk", "open", "step", "close", "manifest", "block", "config", "ok",
         "error", "float32", "bfloat16", "receipt", "transfer", "vote", "tally-test", "bf16", "none"]

scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False, width=32)
           | st.sampled_from(WORDS) | st.text(max_size=12) | st.binary(max_size=64))
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=5)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), kids, max_size=5),
                      max_leaves=24)
maps = st.dictionaries(st.sampled_from(KEYS), values, max_size=6)


def frame(payload: bytes, more: bool = False) -> bytes:
    return struct.pack(">IB", len(payload), 1 if more else 0) + payload


@st.composite
def bombs(draw) -> bytes:
    """Nested containers, wide arrays of empty maps, huge declared lengths (msgpack bytes, not framed)."""
    kind = draw(st.sampled_from(["deep", "wide", "declared", "strs"]))
    if kind == "deep":
        return b"\x81\xa1a" * draw(st.integers(1, 3000)) + b"\xc0"
    if kind == "wide":
        n = draw(st.integers(1, 65535))
        return b"\x81\xa1a\xdc" + n.to_bytes(2, "big") + draw(st.sampled_from([b"\x80", b"\x90", b"\xe0"])) * n
    if kind == "declared":
        return b"\x81\xa1a" + draw(st.sampled_from([b"\xdd\xff\xff\xff\xff", b"\xdf\x7f\xff\xff\xff",
                                                      b"\xc6\x7f\xff\xff\xff", b"\xdb\xff\xff\xff\x00"]))
    return b"\x81\xa1a\xdc\x10\x00" + b"\xa2ab" * 4096


@st.composite
def payloads(draw) -> bytes:
    """What a hostile peer writes on a stream: wire bytes."""
    kind = draw(st.sampled_from(["map", "map", "map", "value", "garbage", "raw", "bomb", "frames"]))
    if kind == "map":
        return frame(pack(draw(maps)))
    if kind == "value":
        return frame(pack(draw(values)))
    if kind == "garbage":
        return frame(draw(st.binary(min_size=1, max_size=200)))
    if kind == "raw":
        return draw(st.binary(max_size=64))
    if kind == "bomb":
        return frame(draw(bombs()))
    # several frames, the last possibly with bad flags or a huge declared length
    body = pack(draw(maps))
    cut = draw(st.integers(0, len(body)))
    tail = draw(st.sampled_from([frame(body[cut:]), b"\xff\xff\xff\xff\x00", struct.pack(">IB", 1, 0x80) + b"x"]))
    return frame(body[:cut], more=True) + tail if cut else tail


# ---------------------------------------------------------------- (a) the decoder

@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), bombs(), values.map(pack)))
def test_decoder_gives_a_value_or_decode_error_within_budget(data):
    tracemalloc.start()
    try:
        try:
            value = unpack(data)
        except DecodeError:
            value = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= decode_budget(len(data)) + (64 << 10)
    if value is not None:
        assert value == msgpack.unpackb(data, strict_map_key=True)


# ---------------------------------------------------------------- (b), (c) a real node's handlers

EXAMPLES = int(os.environ.get("TALLY_FUZZ_EXAMPLES", "12"))  # per protocol (the default keeps the file < 60 s)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


async def exchange(client: P2PHost, peer: str, protocol: str, data: bytes) -> dict | None:
    """Write ``data`` on a new stream, half-close, read one reply: the reply map, or None when the node closed
    or reset the stream without one."""
    stream = await client.open_stream(peer, protocol, timeout=10)
    try:
        try:
            await stream.write(data)
            await stream.close()  # half-close: a handler waiting for more bytes gets EOF
        except Exception:  # noqa: BLE001  the node may already have reset the stream
            return None
        try:
            return await read_msg(stream, timeout=15, max_message=64 << 20)
        except StreamClosed:
            return None
    finally:
        with contextlib.suppress(Exception):
            await stream.reset()


def check_reply(reply: dict | None) -> None:
    if reply is None:
        return
    status = reply.get("status")
    assert status in ("ok", "error"), reply
    if status == "error":
        assert isinstance(reply.get("code"), str) and isinstance(reply.get("message"), str), reply


def test_every_handler_answers_hostile_messages_cleanly(tmp_path, tiny, caplog):
    caplog.set_level(logging.ERROR)
    g = tiny_genesis(1)
    ran: dict[str, int] = {}
    seen_replies: dict[str, set] = {}

    async def main():
        async with trio.open_nursery() as n:
            node = Node(node_config(tmp_path, 0, g, tiny, span=(0, 6)))
            n.start_soon(node.run)
            await node.started.wait()
            node.host.scores = PeerScores(disconnect_at=-1e12)  # the fuzzing peer is scored, never banned
            async with hello_peer(node, g, agent="fuzz") as (client, hello):
                protocols = sorted(str(p) for p in node.host._handlers)
                assert {"/tally/hello/1.0.0", "/tally/sync/1.0.0", "/tally/inference/2.0.0"} <= set(protocols)
                token = trio.lowlevel.current_trio_token()

                async def one(protocol: str, data: bytes) -> None:
                    reply = await exchange(client, node.host.peer_id, protocol, data)
                    check_reply(reply)
                    ran[protocol] = ran.get(protocol, 0) + 1
                    seen_replies.setdefault(protocol, set()).add(None if reply is None else
                                                                 reply.get("code", reply.get("status")))

                gossip = {"tx": node.ledger._on_tx_gossip, "consensus": node.ledger._on_consensus_gossip,
                          "shards": node._on_shards}

                async def one_gossip(topic: str, data: bytes) -> None:
                    handler = gossip[topic]
                    if topic == "tx":
                        node.ledger._validate_tx_gossip(data, client.peer_id)
                    await handler(data, client.peer_id)
                    ran["gossip/" + topic] = ran.get("gossip/" + topic, 0) + 1

                def fuzz_streams() -> None:
                    for protocol in protocols:  # each protocol gets its own examples
                        fuzz_one(protocol)

                def fuzz_one(protocol: str) -> None:
                    @settings(max_examples=EXAMPLES, deadline=None, database=None,
                              suppress_health_check=list(HealthCheck))
                    @given(payloads())
                    def fuzz(data: bytes) -> None:
                        trio.from_thread.run(one, protocol, data, trio_token=token)

                    fuzz()

                def fuzz_gossip() -> None:
                    for topic in gossip:
                        fuzz_topic(topic)

                def fuzz_topic(topic: str) -> None:
                    @settings(max_examples=EXAMPLES, deadline=None, database=None,
                              suppress_health_check=list(HealthCheck))
                    @given(st.one_of(payloads().map(lambda b: b[5:] if len(b) > 5 else b), maps.map(pack)))
                    def fuzz(data: bytes) -> None:
                        trio.from_thread.run(one_gossip, topic, data, trio_token=token)

                    fuzz()

                with trio.fail_after(240):
                    await trio.to_thread.run_sync(fuzz_streams)
                    await trio.to_thread.run_sync(fuzz_gossip)
                # the node still answers normal requests, from the same (scored) peer and keeps its chain
                reply = await client.request(node.host.peer_id, HELLO_PROTOCOL, hello, timeout=10)
                assert reply["genesis"] == g.hash.hex()
                sync = await client.request(node.host.peer_id, "/tally/sync/1.0.0", {"from": 1}, timeout=10)
                assert sync["head"] >= 1
                height = node.ledger.state.height
                await node.ledger.wait_for_height(height + 2, timeout=30)
            n.cancel_scope.cancel()

    trio.run(main)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith(("node", "tally"))]
    assert not errors, [(r.name, r.getMessage()[:300]) for r in errors[:5]]
    print("examples per protocol:", ran)
    print("replies seen:", {p: sorted(map(str, c)) for p, c in seen_replies.items()})
    assert all(ran[p] >= 1 for p in ran)

