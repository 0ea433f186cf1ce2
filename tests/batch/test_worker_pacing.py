"""A batch worker with many results ready paces its commits and reveals by the blocks: at most
``MAX_OUTSTANDING`` of its own transactions wait in its mempool at any block (real nodes in one process: libp2p on
127.0.0.1, LevelDB, the tiny model). Without the cap each worker queued all of its commits at once; five workers
doing that with hundreds of items each flooded the validator's gossip until followers fell behind (see
``tests/batch/test_batch_processes.py``)."""

from __future__ import annotations

import json

import pytest
import trio

from node.batch import worker as worker_mod
from node.batch.client import items_of, post_batch
from node.compute.model import make_tiny
from node.ledger.core.batchstate import BatchStatus, ItemStatus
from node.ledger.core.batchtx import BatchCommit, BatchReveal
from node.runtime import Node

from ..e2e.swarm import node_config, tiny_genesis
from .offers import wait_offers

CAP = 4
N_ITEMS = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_worker_keeps_at_most_max_outstanding_txs_queued(tmp_path, tiny, monkeypatch):
    monkeypatch.setattr(worker_mod, "MAX_OUTSTANDING", CAP)
    g = tiny_genesis(2, block_time_ms=600)  # slowish blocks: many results are ready before the next one
    data = "".join(json.dumps({"prompt": f"Now is the winter of our discontent {i}"}) + "\n"
                   for i in range(N_ITEMS)).encode()
    most: dict[bytes, int] = {}

    async def watch(nd: Node, done: trio.Event) -> None:  # this worker's own batch txs queued, every 5 ms
        me = nd.ident.account
        while not done.is_set():
            mp = nd.ledger.mempool
            n = sum(1 for tid in mp if mp[tid].sender == me and isinstance(mp[tid], (BatchCommit, BatchReveal)))
            most[me] = max(most.get(me, 0), n)
            await trio.sleep(0.005)

    async def main():
        async with trio.open_nursery() as n:
            nodes = [Node(node_config(tmp_path, 0, g, tiny))]
            n.start_soon(nodes[0].run)
            await nodes[0].started.wait()
            done = trio.Event()
            for i in (1, 2):
                cfg = node_config(tmp_path, i, g, tiny)
                cfg.bootstrap = nodes[0].host.addrs
                cfg.accept_batches = True
                nodes.append(Node(cfg))
                n.start_soon(nodes[i].run)
                n.start_soon(watch, nodes[i], done)
            for nd in nodes:
                await nd.started.wait()
            req = nodes[0]
            await wait_offers(req, [nd.ident.account for nd in nodes[1:]])
            p = await post_batch(req, data, kind="generate", replication=2, quorum=2, price=10**6, max_tokens=1,
                                 commit_window=400, reveal_window=200)
            with trio.fail_after(120):
                while True:
                    b = req.ledger.state.tables["batches"].get(p.batch_id)
                    if b is not None and b.status == BatchStatus.SETTLED:
                        break
                    await req.ledger.new_block.wait()
            done.set()
            st = req.ledger.state.detach()
            n.cancel_scope.cancel()
        return p, st

    p, st = trio.run(main)
    b = st.tables["batches"][p.batch_id]
    assert b.accepted == N_ITEMS and all(it.status == ItemStatus.ACCEPTED for it in items_of(st, b))
    assert st.supply() == g.supply
    assert len(most) == 2
    # 24 items = 48 txs per worker, computed within a few blocks: unpaced (the cap set to 1000) 10 to 28 of them
    # were seen queued at once; paced, never more than the cap
    assert all(1 <= m <= CAP for m in most.values()), most
