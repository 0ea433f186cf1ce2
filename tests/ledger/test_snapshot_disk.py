"""Snapshots on disk (node.ledger.snapstore): chunks written as content-addressed files, the manifest last, the
last K kept and the rest (and their chunks) deleted; served from disk over real libp2p peers, also by a server
started again on the same directory (a restart); a chunk damaged on disk is never served; a crash's temporary
files are cleaned up."""

from __future__ import annotations

import pytest

from node.ledger import snapshot as snap, statesync as ss
from node.ledger.core.chain import commit_block, propose
from node.ledger.snapstore import SnapshotDir
from node.ledger.store import LedgerStore
from tests.p2p.util import run, running_hosts

from .helpers import VALIDATOR, make_genesis
from .test_store import grow


def _next(store, state, t):
    block, new, _ = propose(state, [], VALIDATOR, t, store.last_commit())
    store.append(block, commit_block(VALIDATOR, block), state, new)
    return new


def test_disk_snapshots_keep_the_last_k_and_survive_a_restart(tmp_path):
    g = make_genesis()
    src = LedgerStore(tmp_path / "src", g)
    state = grow(src, src.replay(), g, 4)
    sdir = tmp_path / "snapshots"
    server = ss.SnapshotServer(src, every=4, chunk_bytes=700, directory=sdir, keep=2)
    made = []

    async def make_three():
        nonlocal state
        for _ in range(3):
            await server.on_block(state.height)
            made.append(server.manifest)
            state = grow(src, state, g, 4)

    run(make_three, timeout=60)
    assert [m.height for m in made] == [4, 8, 12] and all(len(m.chunks) > 1 for m in made)
    d = SnapshotDir(sdir)
    assert [m.height for m in d.manifests()] == [8, 12]  # the oldest is gone
    files = {p.name for p in (sdir / "chunks").iterdir()}
    assert files == {c.hex() for m in made[1:] for c in m.chunks}  # and its chunks no kept snapshot shares
    for m in made[1:]:
        for c in m.chunks:
            assert snap.chunk_id(d.chunk(c)) == c
    # a crash mid-write leaves a temporary file: removed at open, never listed
    (sdir / "chunks" / ".tmp-deadbeef.1").write_bytes(b"half")
    (sdir / ".tmp-0000000000000099.manifest.1").write_bytes(b"half")
    SnapshotDir(sdir)
    assert not list(sdir.glob(".tmp-*")) and not list((sdir / "chunks").glob(".tmp-*"))
    state = _next(src, state, 9000)  # block 17: the snapshots' next blocks are all stored
    # a restart: a new server on the same directory serves the newest kept snapshot from disk
    again = ss.SnapshotServer(src, every=4, directory=sdir)
    assert again.manifest == made[2] and isinstance(again.chunks, ss.DiskChunks)
    with pytest.raises(ValueError):
        d.put_chunk(b"\x00" * 32, b"not these bytes")
    with pytest.raises(ValueError, match="keep"):
        SnapshotDir(sdir, keep=0)

    async def sync():
        dst = LedgerStore(tmp_path / "dst", g)
        async with running_hosts(2) as (h_src, h_dst):
            again.install(h_src)
            assert await h_dst.connect(h_src.addrs) == 1
            synced = await ss.state_sync(dst, h_dst, [h_src.peer_id], timeout=10)
            root = synced.state_root() if synced is not None else None
            # a chunk damaged on disk is not served (the client would refuse it anyway)
            victim = sdir / "chunks" / made[2].chunks[0].hex()
            raw = victim.read_bytes()
            victim.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
            assert again.chunks.get(made[2].chunks[0]) is None
            dst2 = LedgerStore(tmp_path / "dst2", g)
            refused = await ss.state_sync(dst2, h_dst, [h_src.peer_id], timeout=10)
            dst2.close()
        dst.close()
        return synced is not None and synced.height == 12, root, refused

    ok, root, refused = run(sync, timeout=60)
    assert ok and root == src.get_block(13)[0].header.state_root
    assert refused is None
    src.close()
