"""Block serving under a reply budget (issue 23, finding 5), with real libp2p hosts on 127.0.0.1 in one process:
block files are streamed from disk, requesters that never read are cut at the write deadline and give their budget
back, requests past a peer's budget get ``busy``, and an honest fetch from another peer succeeds meanwhile. The
memory side (the serving process's RSS) is measured on a node process in test_block_flood_rss.py."""

from __future__ import annotations

import os
import shutil

import pytest
import trio

from node.compute.model import block_file, load_manifest, make_tiny
from node.identity import Identity
from node.p2p.budget import ReplyBudget
from node.p2p.filesend import STREAM_HOLD
from node.p2p.framing import RemoteError, StreamClosed, check_reply, read_msg, write_msg
from node.p2p.host import P2PHost
from node.verify.blockcheck import check_block
from node.verify.blockfetch import BLOCK_PROTOCOL, BlockFetcher, HeldModels

from ..p2p.util import CHAIN

MiB = 1 << 20
BIG = 16 * MiB


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A copy of tiny-1 whose block 0 is a 16 MiB file of random bytes (a server serves what it holds)."""
    src = make_tiny(tmp_path_factory.mktemp("models"), seed=1)
    d = tmp_path_factory.mktemp("served") / "tiny-1"
    shutil.copytree(src, d)
    (d / block_file(0)).write_bytes(os.urandom(BIG))
    return d


def hosts(n: int) -> list[P2PHost]:
    return [P2PHost(Identity.generate(), 0, CHAIN) for _ in range(n)]


async def run_hosts(hs, body):
    async with hs[0].running(), hs[1].running(), hs[2].running():
        for h in hs[1:]:
            assert await h.connect(hs[0].addrs) == 1
        return await body()


def test_readers_that_never_read_are_cut_and_an_honest_fetch_succeeds(tmp_path, served):
    m = load_manifest(served)
    budget = ReplyBudget(per_peer=2 * STREAM_HOLD, node_wide=4 * STREAM_HOLD, wait=0.5)
    server, attacker, honest = hosts(3)
    held = HeldModels(served, tmp_path / "server-fetched")
    server.set_handler(BLOCK_PROTOCOL, held.stream_handler(budget, stall=1.0))
    req = {"type": "block", "model_id": m.model_id, "index": 0}
    assert len(__import__("node.encoding", fromlist=["pack"]).pack(req)) < 64  # a 60-byte request

    async def body():
        streams = []
        for _ in range(8):  # eight requests for the 16 MiB block, never read
            s = await attacker.open_stream(server.peer_id, BLOCK_PROTOCOL)
            await write_msg(s, req, timeout=5)
            streams.append(s)
        await trio.sleep(0.3)
        during = budget.held_by(attacker.peer_id)
        fetcher = BlockFetcher(honest, tmp_path / "honest", lambda mid, b: [server.peer_id], timeout=30)
        with trio.fail_after(30):
            d = await fetcher.ensure(m.model_id, 1, 2)  # another peer, during the flood
        honest_done_while_flooded = budget.held_by(attacker.peer_id) > 0
        with trio.fail_after(20):  # cut at the 1 s write deadline (py-libp2p's own zero-window limit is 5 s)
            while not budget.whole():
                await trio.sleep(0.05)
        # what the attacker's streams hold: two were cut mid-reply, six got "busy" (its budget was full)
        busy, cut = 0, 0
        for s in streams:
            try:
                check_reply(await read_msg(s, timeout=10, max_message=BIG + MiB))
            except RemoteError as e:
                assert e.code == "busy"
                busy += 1
            except StreamClosed:
                cut += 1
        return during, d, honest_done_while_flooded, busy, cut

    during, d, while_flooded, busy, cut = trio.run(run_hosts, [server, attacker, honest], body)
    assert during == 2 * STREAM_HOLD  # the attacker held its whole per-peer budget, no more
    check_block((d / block_file(1)).read_bytes(), m.block_hashes[1])
    assert not list(d.glob("*.part*"))  # fetched into a part file, checked, moved into place
    assert while_flooded
    assert (busy, cut) == (6, 2)
    assert budget.whole() and budget.refused  # everything came back
    assert budget.stats()["refused_peer"] == 6


def test_a_reader_gets_the_whole_file_and_busy_is_retried(tmp_path, served):
    """A 16 MiB block streamed to a reader arrives whole (the receiver's read_msg is unchanged); a fetcher told
    ``busy`` asks again after a pause and gets the block."""
    m = load_manifest(served)
    budget = ReplyBudget(per_peer=STREAM_HOLD, node_wide=STREAM_HOLD, wait=0.05)
    server, a, b = hosts(3)
    server.set_handler(BLOCK_PROTOCOL, HeldModels(served, tmp_path / "sf").stream_handler(budget, stall=5.0))

    async def body():
        with trio.fail_after(60):
            reply = await a.request(server.peer_id, BLOCK_PROTOCOL, {"type": "block", "model_id": m.model_id,
                                                                     "index": 0}, timeout=60,
                                    max_message=BIG + MiB)
        assert reply["data"] == (served / block_file(0)).read_bytes()
        assert budget.whole()
        r = budget.try_reserve("someone else", STREAM_HOLD)  # the node-wide budget is full for a while
        with pytest.raises(RemoteError) as e:
            await b.request(server.peer_id, BLOCK_PROTOCOL, {"type": "block", "model_id": m.model_id,
                                                             "index": 1}, timeout=10)
        assert e.value.code == "busy"
        budget.release(r)
        fetcher = BlockFetcher(b, tmp_path / "b", lambda mid, i: [server.peer_id], timeout=30)
        await fetcher.manifest(m.model_id)
        r = budget.try_reserve("someone else", STREAM_HOLD)  # full again; given back 1.5 s into the fetch

        async def give_back():
            await trio.sleep(1.5)
            budget.release(r)

        async with trio.open_nursery() as n:
            n.start_soon(give_back)
            with trio.fail_after(30):
                d = await fetcher.ensure(m.model_id, 1, 2)
        return d

    d = trio.run(run_hosts, [server, a, b], body)
    check_block((d / block_file(1)).read_bytes(), m.block_hashes[1])
    assert budget.whole() and budget.refused


def test_errors_and_bad_requests(tmp_path, served):
    m = load_manifest(served)
    budget = ReplyBudget()
    server, a, _ = hosts(3)
    server.set_handler(BLOCK_PROTOCOL, HeldModels(served, tmp_path / "sf").stream_handler(budget))

    async def ask(msg):
        with pytest.raises(RemoteError) as e:
            await a.request(server.peer_id, BLOCK_PROTOCOL, msg, timeout=10)
        return e.value.code

    async def body():
        assert await ask({"type": "block", "model_id": b"\x01" * 32, "index": 0}) == "not_found"
        assert await ask({"type": "block", "model_id": m.model_id, "index": 10_000}) == "not_found"
        assert await ask({"type": "block", "model_id": m.model_id, "index": -1}) == "bad_request"
        assert await ask({"type": "nope", "model_id": m.model_id}) == "bad_request"
        assert await ask({"type": "block", "model_id": m.model_id, "pad": b"x" * 8192}) == "bad_frame"
        tok = await a.request(server.peer_id, BLOCK_PROTOCOL, {"type": "tokenizer", "model_id": m.model_id},
                              timeout=10)
        assert isinstance(tok["files"], dict)
        return budget.whole()

    assert trio.run(run_hosts, [server, a, _], body)
