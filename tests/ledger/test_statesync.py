"""State sync over real libp2p peers on 127.0.0.1: an empty node installs the snapshot two peers offer, refuses
the altered chunks of one (penalising it) and fetches them from the other, and ends with the source's state root;
then it follows the chain from the snapshot's next block."""

from __future__ import annotations

import trio

from node.ledger import snapshot as snap, statesync as ss
from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.store import LedgerStore
from tests.p2p.util import run, running_hosts

from .helpers import VALIDATOR, make_genesis
from .test_store import grow


class Altering(ss.SnapshotServer):
    """A peer that offers the honest manifest but flips a byte of every chunk it sends."""

    async def handle(self, stream, peer):
        from node.p2p.framing import read_msg, write_msg

        msg = await read_msg(stream, timeout=10)
        if msg.get("op") == "chunk":
            data = bytearray(self.chunks[self.manifest.chunks[msg["index"]]])
            data[-1] ^= 1
            await write_msg(stream, {"status": "ok", "data": bytes(data)})
            return
        await write_msg(stream, {"status": "ok", "manifest": self.manifest.to_wire(),
                                 "block": self.store.get_block_raw(self.manifest.height + 1)})


def test_state_sync_from_peers_refuses_altered_chunks_and_follows_the_chain(tmp_path):
    g = make_genesis()
    src = LedgerStore(tmp_path / "src", g)
    state = grow(src, src.replay(), g, 12)
    honest, bad = ss.SnapshotServer(src, every=12, chunk_bytes=700), Altering(src, every=12)  # several chunks

    async def main():
        await honest.on_block(12)
        bad.manifest, bad.chunks = honest.manifest, honest.chunks
        block, new, _ = propose(state, [], VALIDATOR, 9000, src.last_commit())  # block 13 certifies state 12
        src.append(block, commit_block(VALIDATOR, block), state, new)
        dst = LedgerStore(tmp_path / "dst", g)
        async with running_hosts(3) as (h_src, h_bad, h_dst):
            honest.install(h_src)
            bad.install(h_bad)
            for h in (h_src, h_bad):
                assert await h_dst.connect(h.addrs) == 1
            penalties = []
            real = h_dst.penalize
            h_dst.penalize = lambda p, w, ban_s=None: (penalties.append(p), real(p, w, ban_s))[1]
            synced = await ss.state_sync(dst, h_dst, [h_bad.peer_id, h_src.peer_id], timeout=10)
        assert synced is not None and synced.height == 12 and dst.base == 12
        assert synced.state_root() == block.header.state_root
        assert penalties and set(penalties) == {h_bad.peer_id}  # every altered chunk was refused
        # the synced node follows the chain: block 13 from the source applies on the restored state
        got, commit = src.get_block(13)
        nxt = check_and_apply(synced, got, commit)
        dst.append(got, commit, synced, nxt)
        assert nxt.state_root() == new.state_root()
        dst.close()
        return len(honest.manifest.chunks)

    assert run(main, timeout=60) > 2
    src.close()


def test_no_offer_and_a_non_empty_ledger(tmp_path):
    g = make_genesis()
    src = LedgerStore(tmp_path / "src", g)
    grow(src, src.replay(), g, 3)
    server = ss.SnapshotServer(src, every=0)  # never snapshots

    async def main():
        await server.on_block(3)
        async with running_hosts(2) as (a, b):
            server.install(a)
            assert await b.connect(a.addrs) == 1
            dst = LedgerStore(tmp_path / "dst", g)
            got = await ss.state_sync(dst, b, [a.peer_id], timeout=5)
            dst.close()
            return got

    assert run(main, timeout=30) is None
    try:
        trio.run(ss.state_sync, src, None, [])
    except snap.SnapshotError as e:
        assert "empty ledger" in str(e)
    else:
        raise AssertionError("state sync into a ledger with blocks must be refused")
    src.close()
