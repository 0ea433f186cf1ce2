"""State sync from a snapshot: chunks named by content, checked against a finalised header's state root; an
altered chunk, a wrong header or a forged commit is refused and nothing is written; the synced node follows
the chain and keeps the same state root as the node that made every block."""

from __future__ import annotations

import pytest

from node.encoding import pack, unpack
from node.ledger import snapshot as snap
from node.ledger.core.block import InvalidBlock
from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.store import LedgerStore, StoreCorrupt

from .helpers import KEYS, VALIDATOR, make_genesis
from .test_store import grow


def _source(tmp_path, n=14):
    g = make_genesis()
    a = LedgerStore(tmp_path / "a", g)
    state = grow(a, a.replay(), g, n)
    manifest, chunks = snap.make(a.db, g.domain, chunk_bytes=600)  # small chunks: several of them
    # block n + 1 commits to the snapshot's state (the state after block n)
    block, new, _rej = propose(state, [], VALIDATOR, 5000, a.last_commit())
    commit = commit_block(VALIDATOR, block)
    a.append(block, commit, state, new)
    return g, a, new, manifest, [chunks[c] for c in manifest.chunks], block, commit


def test_a_synced_node_reaches_the_same_state_and_follows_the_chain(tmp_path):
    g, a, a_state, manifest, chunks, block, commit = _source(tmp_path)
    assert len(chunks) > 2 and manifest.height == 14
    b = LedgerStore(tmp_path / "b", g)
    assert b.replay().height == 0
    state = snap.restore(b, manifest, chunks, block.header, commit, g.validators)
    assert state.height == 14 and state.state_root() == block.header.state_root and b.base == 14
    new = check_and_apply(state, block, commit)  # the first block after the snapshot, from a peer
    b.append(block, commit, state, new)
    assert new.state_root() == a_state.state_root()
    for _ in range(3):  # both keep making the same chain
        blk, na, _rej = propose(a_state, [], VALIDATOR, 6000 + a_state.height, a.last_commit())
        c = commit_block(VALIDATOR, blk)
        a.append(blk, c, a_state, na)
        nb = check_and_apply(new, blk, c)
        b.append(blk, c, new, nb)
        a_state, new = na, nb
        assert nb.state_root() == na.state_root()
    b.close()
    b = LedgerStore(tmp_path / "b", g)
    assert b.replay().state_root() == a_state.state_root()  # and reopens without the blocks below its base
    with pytest.raises(StoreCorrupt, match="state-synced"):
        b.verify()
    b.close()
    a.close()


def test_altered_chunks_wrong_headers_and_forged_commits_are_refused(tmp_path):
    g, a, _, manifest, chunks, block, commit = _source(tmp_path)
    b = LedgerStore(tmp_path / "b", g)
    bad = list(chunks)
    bad[1] = bad[1][:-1] + bytes([bad[1][-1] ^ 1])
    with pytest.raises(snap.SnapshotError, match="chunk 1 does not match"):
        snap.restore(b, manifest, bad, block.header, commit, g.validators)
    with pytest.raises(snap.SnapshotError, match="chunks for a manifest"):
        snap.restore(b, manifest, chunks[:-1], block.header, commit, g.validators)
    # a manifest that lists a forged chunk: it matches the manifest, counts agree, but one account's balance was
    # raised, so the entries do not give the header's state root
    rows = snap.check_chunk(manifest, 0, chunks[0])
    i = next(i for i, r in enumerate(rows) if snap.TABLES[r[0]] == "accounts")  # the first chunk holds accounts
    acct = unpack(rows[i][2])
    rows[i][2] = pack([acct[0] + 1, *acct[1:]])
    alt = pack(rows)
    fake = snap.Manifest(manifest.chain_id, manifest.height, manifest.last_hash, manifest.seq, manifest.counts,
                         manifest.root, (snap.chunk_id(alt),) + manifest.chunks[1:])
    with pytest.raises(snap.SnapshotError, match="do not give the header's state root"):
        snap.restore(b, fake, [alt] + chunks[1:], block.header, commit, g.validators)
    with pytest.raises(InvalidBlock):
        snap.restore(b, manifest, chunks, block.header, commit, (KEYS[5].account,))  # not that validator set
    with pytest.raises(snap.SnapshotError, match="does not commit"):
        h2 = block.header.__class__(*[block.header.chain_id, 3, *block.header.fields()[1:]])
        snap.restore(b, manifest, chunks, h2, commit, g.validators)
    assert b.head == 0 and b.base == 0 and not list(b.db.iterator(prefix=b"S/", include_value=False))
    with pytest.raises(snap.SnapshotError, match="malformed"):
        snap.Manifest.from_wire(["x", -1])
    assert snap.Manifest.from_wire(manifest.to_wire()) == manifest
    b.close()
    a.close()
