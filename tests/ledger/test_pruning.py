"""Block-body pruning (``node start --prune-bodies N``): the last N bodies stay, older ones are deleted in the batch
of a later block (bounded per block), headers and commits stay; the store says where its bodies start; verify
from genesis is refused with a clear error; a peer asking for a pruned block is told the lowest height held; a
node state-synced from a pruning peer (whose snapshot's next block body is pruned) prunes and follows the chain."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from node.ledger import statesync as ss
from node.ledger.cli import run_ledger_command
from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.service import SYNC_PROTOCOL, LedgerService
from node.ledger.store import PRUNE_PER_BLOCK, BodiesPruned, LedgerStore
from node.p2p.framing import RemoteError
from tests.p2p.util import run, running_hosts

from .helpers import VALIDATOR, W1, W2, make_genesis, make_receipt


def _grow(store, state, g, n, t0=1000, keep=None):
    """``n`` blocks, each with one receipt; the (block, commit) pairs go to ``keep``."""
    for i in range(n):
        txs = [make_receipt(g, W1 if i % 2 else W2, height=state.height)]
        block, new, rejected = propose(state, txs, VALIDATOR, t0 + i, store.last_commit())
        assert not rejected
        commit = commit_block(VALIDATOR, block)
        store.append(block, commit, state, new)
        if keep is not None:
            keep.append((block, commit))
        state = new
    return state


def test_prune_keeps_the_last_bodies_headers_and_commits(tmp_path):
    g = make_genesis()
    with pytest.raises(ValueError, match="prune_bodies"):
        LedgerStore(tmp_path / "bad", g, prune_bodies=-1)
    store = LedgerStore(tmp_path / "db", g, prune_bodies=3)
    blocks: list = []
    state = _grow(store, store.replay(), g, 12, keep=blocks)
    assert store.pruned_below == 10  # bodies 10, 11, 12 kept
    for h, (block, commit) in enumerate(blocks, start=1):
        d = store.get_header_raw(h)
        assert d["b"]["h"][1] == h and [list(c) for c in d["c"]] == [list(c) for c in commit]
        if h < 10:
            assert store.get_block(h) is None and store.get_block_raw(h) is None
            assert d["pruned"] is True and d["b"]["txs"] == []
            assert d["b"]["h"][5] == block.header.tx_root  # the header (its hash) is unchanged
        else:
            assert store.get_block(h)[0].hash == block.hash and "pruned" not in d
    root = state.state_root()
    store.close()
    store = LedgerStore(tmp_path / "db", g, prune_bodies=3)
    again = store.replay()  # opens the stored state: nothing to replay
    assert again.state_root() == root and store.pruned_below == 10
    with pytest.raises(BodiesPruned, match="cannot be replayed or re-verified from genesis"):
        store.verify()
    store.close()
    # node ledger verify says so and exits 2
    gfile = tmp_path / "genesis.json"
    gfile.write_text(json.dumps(g.to_doc()))
    (tmp_path / "data").mkdir()
    (tmp_path / "db").rename(tmp_path / "data" / "ledger")
    out = io.StringIO()
    rc = run_ledger_command(SimpleNamespace(ledger_cmd="verify", data_dir=tmp_path / "data", genesis=gfile,
                                            repair=False), out)
    assert rc == 2 and "--prune-bodies" in out.getvalue() and "from height 10" in out.getvalue()


def test_a_full_store_pruned_later_catches_up_boundedly(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = _grow(store, store.replay(), g, PRUNE_PER_BLOCK + 10)
    assert store.pruned_below == 0
    store.close()
    store = LedgerStore(tmp_path / "db", g, prune_bodies=2)
    state = _grow(store, store.replay(), g, 1, t0=5000)
    assert store.pruned_below == 1 + PRUNE_PER_BLOCK  # at most PRUNE_PER_BLOCK bodies per block
    state = _grow(store, state, g, 1, t0=6000)
    assert store.pruned_below == store.head - 1
    store.close()


def test_pruned_peer_refuses_old_blocks_and_a_synced_pruning_node_follows(tmp_path):
    g = make_genesis()
    src = LedgerStore(tmp_path / "src", g, prune_bodies=3)
    blocks: list = []
    state = _grow(src, src.replay(), g, 12, keep=blocks)
    server = ss.SnapshotServer(src, every=12)

    async def main():
        await server.on_block(12)
        _grow(src, state, g, 5, t0=3000, keep=blocks)  # head 17: the snapshot's next block (13) is pruned
        assert src.pruned_below == 15 and src.get_block(13) is None
        svc = LedgerService(src, g, VALIDATOR, None)
        dst = LedgerStore(tmp_path / "dst", g, prune_bodies=2)
        async with running_hosts(2) as (h_src, h_dst):
            server.install(h_src)
            h_src.set_handler(SYNC_PROTOCOL, svc._sync_handler)
            assert await h_dst.connect(h_src.addrs) == 1
            with pytest.raises(RemoteError) as e:
                await h_dst.request(h_src.peer_id, SYNC_PROTOCOL, {"from": 13}, timeout=10)
            assert e.value.code == "pruned" and "lowest block it has is 15" in e.value.message
            reply = await h_dst.request(h_src.peer_id, SYNC_PROTOCOL, {"from": 15}, timeout=10)
            assert [b["b"]["h"][1] for b in reply["blocks"]] == [15, 16, 17]
            synced = await ss.state_sync(dst, h_dst, [h_src.peer_id], timeout=10)
        assert synced is not None and synced.height == 12
        assert synced.state_root() == blocks[12][0].header.state_root  # header 13 commits to state 12
        assert dst.pruned_below == 13  # blocks up to the base are absent
        st = synced
        for block, commit in blocks[12:]:  # follow the chain from block 13 (bodies from a full node)
            nxt = check_and_apply(st, block, commit)
            dst.append(block, commit, st, nxt)
            st = nxt
        assert dst.head == 17 and dst.pruned_below == 16 and dst.get_block(15) is None
        assert dst.get_block(17)[0].hash == blocks[16][0].hash and dst.get_header_raw(14)["pruned"]
        root = st.state_root()
        dst.close()
        dst = LedgerStore(tmp_path / "dst", g, prune_bodies=2)
        assert dst.replay().state_root() == root
        dst.close()

    run(main, timeout=60)
    src.close()


def test_the_api_says_a_body_is_pruned(tmp_path):
    """The real API app over a real pruning store: a pruned block's summary (its header) is listed, its body and
    its transactions are a clear 404 naming the lowest height held."""
    from starlette.testclient import TestClient

    from node.api.app import create_app

    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g, prune_bodies=2)
    blocks: list = []
    _grow(store, store.replay(), g, 6, keep=blocks)
    svc = LedgerService(store, g, VALIDATOR, None)
    node = SimpleNamespace(store=store, ledger=svc, genesis=g, ident=VALIDATOR, api_token="t")
    c = TestClient(create_app(node), base_url="http://127.0.0.1")
    js = {"accept": "application/json"}
    got = c.get("/v1/blocks/2", headers=js)
    assert got.status_code == 404 and "pruned" in got.json()["message"] and "from height 5" in got.json()["message"]
    assert c.get("/v1/blocks/6", headers=js).status_code == 200
    tx = blocks[1][0].txs[0]
    got = c.get(f"/v1/txs/{tx.id.hex()}", headers=js)
    assert got.status_code == 404 and "pruned" in got.json()["message"]
    got = c.get(f"/v1/proofs/receipts/{tx.id.hex()}", headers=js)
    assert got.status_code == 404 and "pruned" in got.json()["message"]
    listed = c.get("/v1/blocks?limit=10", headers=js).json()["blocks"]
    assert [b["height"] for b in listed] == [6, 5, 4, 3, 2, 1]
    assert [b["hash"] for b in listed[::-1]] == [b.hash.hex() for b, _ in blocks]
    store.close()
