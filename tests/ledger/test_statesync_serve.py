"""The serving side of state sync (issue 23, finding 5 for /tally/snapshot/1.0.0), over real libp2p hosts on
127.0.0.1: a chunk is streamed from disk under a write deadline per frame, so readers that never read are cut and
give their reply budget back; a peer past its budget is answered ``busy``; a chunk file damaged on disk is never
sent whole."""

from __future__ import annotations

import os

import pytest
import trio

from node.encoding import pack
from node.ledger import snapshot as snap, statesync as ss
from node.ledger.snapstore import SnapshotDir
from node.ledger.store import LedgerStore
from node.p2p.budget import ReplyBudget
from node.p2p.filesend import STREAM_HOLD
from node.p2p.framing import RemoteError, StreamClosed, read_msg, write_msg
from tests.p2p.util import run, running_hosts

from .helpers import make_genesis

BIG = 3 << 20  # bytes of the chunk: more than a stream's flow-control window holds unread


@pytest.fixture
def served(tmp_path):
    """A server whose kept snapshot is one chunk of ~3 MiB (served from its directory), and that chunk."""
    g = make_genesis()
    store = LedgerStore(tmp_path / "ledger", g)
    d = SnapshotDir(tmp_path / "snapshots")
    data = pack([[0, b"\x01" * 32, os.urandom(BIG)]])
    cid = snap.chunk_id(data)
    d.put_chunk(cid, data)
    m = snap.Manifest(g.domain, 5, b"\0" * 32, 0, (1,) + (0,) * (len(snap.TABLES) - 1), b"\0" * 40, (cid,))
    d.write(m)
    server = ss.SnapshotServer(store, every=0, directory=tmp_path / "snapshots")
    assert server.manifest == m
    yield server, m, data, d
    store.close()


def ask(m: snap.Manifest) -> dict:
    return {"op": "chunk", "snapshot": m.id, "index": 0}


async def never_read(client, server_host, m: snap.Manifest, n: int) -> list:
    """``n`` chunk requests whose replies are never read."""
    streams = []
    for _ in range(n):
        st = await client.open_stream(server_host.peer_id, ss.SNAPSHOT_PROTOCOL)
        await write_msg(st, ask(m))
        streams.append(st)
    return streams


def test_readers_that_never_read_are_cut_and_give_their_budget_back(served):
    server, m, data, _ = served
    server.stall_s = 1.0

    async def main():
        async with running_hosts(2) as (a, b):
            server.install(a)
            assert await b.connect(a.addrs) == 1
            held = await never_read(b, a, m, 6)
            with trio.fail_after(30):  # each is cut after stall_s without progress, its reservation given back
                while server.budget.granted < 6 or not server.budget.whole():
                    await trio.sleep(0.05)
            cut = 0
            for st in held:  # what the peer finds when it reads at last: a whole reply, or a reset stream
                try:
                    await read_msg(st, timeout=10, max_message=BIG + 1024)
                except StreamClosed:
                    cut += 1
            reply = await b.request(a.peer_id, ss.SNAPSHOT_PROTOCOL, ask(m), timeout=20, max_message=BIG + 1024)
            return cut, reply["data"] == data

    cut, served_whole = run(main, timeout=60)
    assert cut >= 1 and served_whole  # transport buffers take a reply or two; the rest were cut, not held


def test_a_peer_past_its_budget_is_answered_busy(served):
    server, m, data, _ = served
    server.budget = ReplyBudget(per_peer=STREAM_HOLD, node_wide=2 * STREAM_HOLD, wait=0.2)  # one reply a peer

    async def main():
        async with running_hosts(2) as (a, b):
            server.install(a)
            assert await b.connect(a.addrs) == 1
            held = server.budget.try_reserve(b.peer_id, STREAM_HOLD)  # as if a reply to b were in flight
            with pytest.raises(RemoteError) as e:
                await b.request(a.peer_id, ss.SNAPSHOT_PROTOCOL, ask(m), timeout=10, max_message=BIG + 1024)
            server.budget.release(held)
            reply = await b.request(a.peer_id, ss.SNAPSHOT_PROTOCOL, ask(m), timeout=20, max_message=BIG + 1024)
            return e.value.code, reply["data"] == data, server.budget.refused, server.budget.whole()

    code, got, refused, whole = run(main, timeout=60)
    assert code == "busy" and got and sum(refused.values()) == 1 and whole


def test_a_chunk_damaged_on_disk_is_never_sent_whole(served):
    server, m, _, d = served
    path = d.chunk_dir / m.chunks[0].hex()
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1  # the last byte: the reply is cut before its last frame
    path.write_bytes(bytes(raw))

    async def main():
        async with running_hosts(2) as (a, b):
            server.install(a)
            assert await b.connect(a.addrs) == 1
            with pytest.raises((StreamClosed, RemoteError)):
                await b.request(a.peer_id, ss.SNAPSHOT_PROTOCOL, ask(m), timeout=20, max_message=BIG + 1024)
            return server.budget.whole()

    assert run(main, timeout=60)
