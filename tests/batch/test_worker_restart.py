"""A batch worker stopped between its commit and its reveal reveals after a restart from the salts it persisted
(real nodes: libp2p on 127.0.0.1, LevelDB reopened, tiny model). The third drawn worker never runs, so the reveal
phase opens only when the commit window passes, after the restart."""

from __future__ import annotations

import json

import pytest
import trio

from node.batch.client import items_of, post_batch
from node.compute.model import make_tiny
from node.identity import Identity, dev_seed
from node.ledger.core.batchstate import BatchStatus, Fate
from node.ledger.core.batchtx import BatchOffer
from node.runtime import Node

from ..e2e.swarm import C, node_config, tiny_genesis
from .offers import wait_offers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_worker_reveals_after_restart(tmp_path, tiny):
    g = tiny_genesis(3, batch_slash=10 * C)
    data = "".join(json.dumps({"prompt": f"Now is the winter {i}"}) + "\n" for i in range(2)).encode()

    async def start(n, i):
        cfg = node_config(tmp_path, i, g, tiny)
        if i:
            cfg.bootstrap = req.host.addrs
            cfg.accept_batches = True
        nd = Node(cfg)
        scope, stopped = trio.CancelScope(), trio.Event()

        async def run():
            try:
                with scope:
                    await nd.run()
            finally:
                stopped.set()
        n.start_soon(run)
        with trio.fail_after(120):  # a node that failed to start (its run raised) never sets started
            while not nd.started.is_set():
                if stopped.is_set():
                    raise AssertionError(f"node {i} stopped before it started")
                await trio.sleep(0.05)
        return nd, (scope, stopped)

    async def main():
        nonlocal req
        async with trio.open_nursery() as n:
            req, _ = await start(n, 0)
            w1, s1 = await start(n, 1)
            w2, _ = await start(n, 2)
            me1 = w1.ident.account
            k3 = Identity.from_seed(dev_seed(3))  # bonded and opted in, but its node never runs: absent
            await req.ledger.submit(BatchOffer(req.ledger.chain_id, k3.account, 0, 0).signed(k3))
            await wait_offers(req, [w1.ident.account, w2.ident.account, k3.account])
            p = await post_batch(req, data, kind="generate", replication=3, quorum=2, price=10**6, max_tokens=3,
                                 commit_window=20, reveal_window=60)
            with trio.fail_after(60):  # worker 1's commitments on the ledger: stop it before it can reveal
                while True:
                    b = req.ledger.state.tables["batches"].get(p.batch_id)
                    if b is not None and b.assigned == 2 and all(
                            it.commitment_of(me1) for it in items_of(req.ledger.state, b)):
                        break
                    await req.ledger.new_block.wait()
            assert not any(it.reveals for it in items_of(req.ledger.state, b))  # reveals not open yet
            salts = sorted(x.name for x in (w1.cfg.data_dir / "batch" / "commits").glob("*.json"))
            s1[0].cancel()
            with trio.fail_after(60):  # closed (its LevelDB too) before the same data dir is opened again: a
                await s1[1].wait()  # second open while the first holds the lock fails (and must not be retried)
            w1b, _ = await start(n, 1)  # same data dir, key, ledger and salts; a fresh process state
            assert w1b.batches.done == 0  # it computes nothing again
            with trio.fail_after(60):
                while req.ledger.state.tables["batches"][p.batch_id].status != BatchStatus.SETTLED:
                    await req.ledger.new_block.wait()
            with trio.fail_after(10):  # the restarted worker saw the decision and dropped its salts
                while list((w1.cfg.data_dir / "batch" / "commits").glob("*.json")):
                    await trio.sleep(0.1)
            st = req.ledger.state.detach()
            n.cancel_scope.cancel()
        return p, st, salts, [nd.ident.account for nd in (w1, w2)], g

    req = None
    p, st, salts, (a1, a2), g = trio.run(main)
    assert len(salts) == 2  # one persisted salt per item before the stop
    b = st.tables["batches"][p.batch_id]
    assert b.accepted == 2
    for it in items_of(st, b):
        fates = {w: f for _a, w, f, _x in it.history}
        assert fates[a1] == Fate.AGREED and fates[a2] == Fate.AGREED  # worker 1 revealed after its restart
        assert list(fates.values()).count(Fate.ABSENT) == 1  # the worker that never ran
        assert set(it.agreed) == {a1, a2}
    assert st.supply() == g.supply
