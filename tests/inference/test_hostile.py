"""Hostile peers: malformed frames of every kind get an error frame and a lower score, repeat offenders are
disconnected, and the node keeps serving valid requests with bounded memory (real libp2p on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import gc
import struct

import pytest
import torch
import trio

from node.blobs import BlobStore
from node.compute.executor import TorchExecutor
from node.compute.span import SpanModel
from node.encoding import MAX_FRAME, pack
from node.identity import Identity
from node.inference.server import INFERENCE_PROTOCOL, SpanServer
from node.inference.wire import encode_hidden
from node.p2p.framing import StreamClosed, _io_errors, read_msg, write_msg
from node.p2p.host import P2PHost, PeerUnreachable
from node.p2p.scoring import PeerScores

CHAIN = "tally-test"
HDR = struct.Struct(">IB")
# what a stream raises when the node has reset it or dropped the connection; never AssertionError, FrameError
# (the reply must be a well-formed frame) or RequestTimeout (the node must answer within the timeout)
GONE = (StreamClosed, PeerUnreachable) + _io_errors()


def frame(payload: bytes, flags: int = 0) -> bytes:
    return HDR.pack(len(payload), flags) + payload


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_peer_scores_decay_disconnect_and_ban():
    now = [0.0]
    s = PeerScores(clock=lambda: now[0], disconnect_at=-10, recovery_per_s=1.0, ban_s=30)
    assert s.score("p") == 0 and not s.banned("p")
    assert not s.penalize("p", 4) and s.score("p") == -4
    now[0] += 2
    assert s.score("p") == -2  # recovers towards 0
    assert not s.penalize("p", 5) and s.score("p") == -7
    assert s.penalize("p", 5)  # crossed -10: disconnect
    assert s.banned("p") and s.score("p") == 0 and s.disconnects == 1 and s.offences("p") == 3
    now[0] += 31
    assert not s.banned("p")
    assert s.penalize("q", 1000, ban_s=600)  # a peer of another genesis: a longer ban than the default
    now[0] += 599
    assert s.banned("q")
    now[0] += 2
    assert not s.banned("q")
    small = PeerScores(max_peers=2)
    for p in "abc":
        small.penalize(p, 1)
    assert small.score("a") == 0 and small.score("c") < 0  # bounded memory: the oldest is forgotten
    with pytest.raises(ValueError):
        PeerScores(disconnect_at=1)


def _open_msg(span) -> dict:
    return {"type": "open", "session_id": b"s" * 16, "model_id": span.model_id, "start": span.start,
            "end": span.end, "max_length": 8}


def malformed(span) -> list[tuple[str, bytes, bytes | None]]:
    """(kind, bytes of the first message, bytes of a second message after a valid open or None)."""
    H = span.hidden_size
    good_open = pack(_open_msg(span))
    step = lambda hidden: frame(pack({"type": "step", "hidden": hidden}))  # noqa: E731
    ok = encode_hidden(torch.zeros(1, 1, H), "none")[0]
    return [
        ("truncated msgpack", frame(good_open[:len(good_open) // 2]), None),
        ("malformed msgpack", frame(b"\xc1\xc1\xc1"), None),
        ("tiny bin declaring 2 GiB", frame(b"\xc6\x7f\xff\xff\xff" + b"abc"), None),
        ("tiny array declaring 4G items", frame(b"\xdd\xff\xff\xff\xff\x00"), None),
        ("not a map", frame(pack(12345)), None),
        ("frame over the limit", HDR.pack(MAX_FRAME + 1, 0), None),
        ("unknown frame flags", HDR.pack(3, 0x80) + b"abc", None),
        ("bad open fields", frame(pack({**_open_msg(span), "session_id": b"short"})), None),
        ("unknown dtype code", frame(good_open), step({**ok, "dtype": "complex64"})),
        ("shape does not match buffer", frame(good_open), step({**ok, "shape": [1, 4, H]})),
        ("huge shape, tiny buffer", frame(good_open), step({**ok, "shape": [1, 2**40, H]})),
        ("step that is not msgpack", frame(good_open), frame(b"\xc1")),
    ]


async def _serving(tiny, tmp_path, scores):
    ident = Identity.generate()
    host = P2PHost(ident, 0, CHAIN, scores=scores)
    span = SpanModel(tiny, 0, 3)
    server = SpanServer(ident, CHAIN, span, TorchExecutor(1), BlobStore(tmp_path), lambda: 0, 100,
                        step_timeout=5.0, penalize=host.penalize)
    host.set_handler(INFERENCE_PROTOCOL, server.handle)
    return host, server, span


async def _attack(attacker: P2PHost, host: P2PHost, first: bytes, second: bytes | None) -> dict | None:
    """Send one malformed message; return the server's reply (None if the stream was refused)."""
    for _attempt in range(5):  # a persistent attacker: reconnect when the node has just disconnected it
        if host.peer_id not in attacker.connected_peers():
            await attacker.connect(host.addrs)
        try:
            s = await attacker.open_stream(host.peer_id, INFERENCE_PROTOCOL)
            break
        except PeerUnreachable:
            await trio.sleep(0.05)
    else:
        return None  # refused (banned)
    try:
        return await _exchange(s, first, second)
    except GONE:  # the node reset the stream or dropped the attacker: a reply raced by a disconnect
        return None
    finally:
        with trio.move_on_after(1):
            with contextlib.suppress(GONE):
                await s.reset()


async def _exchange(s, first: bytes, second: bytes | None) -> dict:
    """Write ``first`` (after which a valid open must be answered "ok"), then ``second``; return the reply."""
    await s.write(first)
    if second is not None:
        opened = await read_msg(s, timeout=5)
        assert opened["status"] == "ok", opened
        await s.write(second)
    return await read_msg(s, timeout=5)


async def _valid_session(client: P2PHost, host: P2PHost, span) -> None:
    """A correct session after the flood: the output equals the span's own forward."""
    if host.peer_id not in client.connected_peers():
        await client.connect(host.addrs)
    x = torch.randn(1, 3, span.hidden_size)
    s = await client.open_stream(host.peer_id, INFERENCE_PROTOCOL)
    await write_msg(s, {**_open_msg(span), "session_id": bytes(16)})
    assert (await read_msg(s, timeout=5))["status"] == "ok"
    await write_msg(s, {"type": "step", "hidden": encode_hidden(x, "none")[0]})
    reply = await read_msg(s, timeout=10)
    assert reply["status"] == "ok" and len(reply["sig"]) == 64
    out = torch.frombuffer(bytearray(reply["hidden"]["data"]), dtype=torch.float32).reshape(x.shape)
    assert torch.allclose(out, span.prefill(x), atol=1e-5)
    await s.reset()


def test_a_thousand_malformed_frames_then_valid_requests(tiny, tmp_path):
    scores = PeerScores(disconnect_at=-300, ban_s=0)  # disconnect every ~60 offences; reconnecting is allowed

    async def main():
        host, server, span = await _serving(tiny, tmp_path, scores)
        attacker, honest = P2PHost(Identity.generate(), 0, CHAIN), P2PHost(Identity.generate(), 0, CHAIN)
        kinds = malformed(span)
        codes: dict[str, set] = {k: set() for k, _, _ in kinds}
        async with host.running(), attacker.running(), honest.running():
            await attacker.connect(host.addrs)
            for i in range(200):  # warm-up: allocator pools, libp2p buffers, caches
                k, a, b = kinds[i % len(kinds)]
                await _attack(attacker, host, a, b)
            gc.collect()
            before = rss_mb()
            for i in range(1000):
                k, a, b = kinds[i % len(kinds)]
                reply = await _attack(attacker, host, a, b)
                codes[k].add(reply["code"] if reply and reply.get("status") == "error" else None)
            gc.collect()
            grown = rss_mb() - before
            await _valid_session(honest, host, span)
            await _valid_session(attacker, host, span)  # not banned in this test: served like anyone
            return codes, grown, server

    codes, grown, server = trio.run(main)
    print(f"RSS growth over 1000 malformed frames: {grown:.1f} MB; codes {codes}")
    assert grown < 10
    for kind, seen in codes.items():  # every kind got an error frame (a reply raced by a disconnect is None)
        assert seen - {None}, kind
        assert seen <= {"bad_frame", "bad_request", None}, (kind, seen)
    assert scores.disconnects >= 10 and server.active == 0 and server.reserved == 0


def test_repeat_offender_is_disconnected_and_refused_while_others_are_served(tiny, tmp_path):
    scores = PeerScores()  # defaults: 5 points per malformed frame, disconnected at -20, banned for 60 s

    async def main():
        host, _server, span = await _serving(tiny, tmp_path, scores)
        attacker, honest = P2PHost(Identity.generate(), 0, CHAIN), P2PHost(Identity.generate(), 0, CHAIN)
        async with host.running(), attacker.running(), honest.running():
            await attacker.connect(host.addrs)
            replies = []
            while not scores.disconnects and len(replies) < 10:
                replies.append(await _attack(attacker, host, frame(b"\xc1"), None))
            with trio.fail_after(5):
                while host.peer_id in attacker.connected_peers():
                    await trio.sleep(0.05)
            after_ban = await _attack(attacker, host, frame(b"\xc1"), None)
            await _valid_session(honest, host, span)
            return replies, after_ban

    replies, after_ban = trio.run(main)
    assert len(replies) in (4, 5)  # -20 after four, or five once the score has recovered a little
    assert [r["code"] for r in replies[:-1]] == ["bad_frame"] * (len(replies) - 1)
    assert replies[-1] is None or replies[-1]["code"] == "bad_frame"  # may race the disconnect
    assert after_ban is None  # its streams are reset unanswered while banned
    assert scores.disconnects == 1 and scores.score(next(iter(scores._peers))) == 0
