"""Four validators on loopback (real libp2p, LevelDB, gossip): finality, double-sign evidence, a 2|2 partition."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio

from node.compute.model import make_tiny
from node.config import NodeConfig
from node.identity import Identity, dev_seed
from node.ledger.core.staking import evidence_of
from node.ledger.genesis import Genesis, Params
from node.runtime import Node

C = 10**9
N = 4


def validator_genesis() -> Genesis:
    keys = [Identity.from_seed(dev_seed(i)) for i in range(N)]
    p = Params(block_time_ms=200, price_per_token_block=100_000, max_receipt_price=50 * C)
    return Genesis("tally-test-bft", 0, tuple(k.account for k in keys),
                   tuple((k.account, 100 * C, 200 * C) for k in keys), p)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


@asynccontextmanager
async def validators(tmp, model_dir, faults=None):
    g = validator_genesis()
    faults = faults or {}
    async with trio.open_nursery() as n:
        nodes = []
        for i in range(N):
            cfg = NodeConfig(data_dir=tmp / f"v{i}", genesis=g, model_dir=model_dir, seed=dev_seed(i),
                             fault=faults.get(i), bootstrap=[a for nd in nodes for a in nd.host.addrs[:1]])
            nd = Node(cfg)
            nodes.append(nd)
            n.start_soon(nd.run)
            await nd.started.wait()
        try:
            yield nodes
        finally:
            n.cancel_scope.cancel()


async def wait_all_height(nodes, h, timeout=30):
    with trio.fail_after(timeout):
        while min(nd.ledger.state.height for nd in nodes) < h:
            await trio.sleep(0.05)


def assert_no_fork(nodes):
    top = min(nd.store.head for nd in nodes)
    for h in range(1, top + 1):
        hashes = {nd.store.get_block(h)[0].hash for nd in nodes}
        assert len(hashes) == 1, f"fork at height {h}"


def test_four_validators_finalize_without_forks(tmp_path, tiny):
    async def main():
        async with validators(tmp_path, tiny) as nodes:
            await wait_all_height(nodes, 8)
            assert_no_fork(nodes)
            _blk, commit = nodes[1].store.get_block(5)
            assert len({v for v, _, _ in commit}) >= 3  # > 2/3 of 4 precommits
            return [t for nd in nodes for t in nd.ledger.driver.decide_times]

    times = trio.run(main)
    assert sorted(times)[len(times) // 2] < 1.0


def test_double_signing_validator_is_slashed_once(tmp_path, tiny):
    async def main():
        async with validators(tmp_path, tiny, faults={3: "equivocate"}) as nodes:
            cheat = nodes[3].ident.account
            with trio.fail_after(30):
                while not evidence_of(nodes[0].ledger.state):
                    await trio.sleep(0.05)
            await wait_all_height(nodes, nodes[0].ledger.state.height + 3)
            st = nodes[0].ledger.state
            assert len(evidence_of(st)) == 1
            # resubmitting the same evidence is refused and changes nothing
            ev = next(tx for h in range(1, nodes[0].store.head + 1) for tx in nodes[0].store.get_block(h)[0].txs
                      if tx.KIND == "evidence")
            from node.ledger.core.state import apply_tx
            from node.ledger.core.tx import InvalidTx

            trial = st.copy()
            with pytest.raises(InvalidTx, match="once"):
                apply_tx(trial, ev)
            await nodes[1].ledger.submit(ev)
            await wait_all_height(nodes, st.height + 3)
            st2 = nodes[0].ledger.state
            assert_no_fork(nodes)
            return st.account(cheat), st2.account(cheat), st2.params.slash_amount, len(evidence_of(st2))

    before, after, slash, n_ev = trio.run(main)
    assert before.bond == 200 * C - slash and after.bond == before.bond and n_ev == 1


def test_two_two_partition_stalls_then_heals_without_fork(tmp_path, tiny):
    async def main():
        async with validators(tmp_path, tiny) as nodes:
            await wait_all_height(nodes, 3)
            half = {nodes[0].ident.peer_id, nodes[1].ident.peer_id}
            for nd in nodes:
                mine = nd.ident.peer_id in half
                nd.ledger.drop = lambda peer, mine=mine: (peer in half) != mine
            await trio.sleep(1.0)  # let in-flight heights finish
            stalled = max(nd.ledger.state.height for nd in nodes)
            await trio.sleep(3.0)
            during = max(nd.ledger.state.height for nd in nodes)
            for nd in nodes:
                nd.ledger.drop = None
            await wait_all_height(nodes, during + 3, timeout=40)
            assert_no_fork(nodes)
            return stalled, during

    stalled, during = trio.run(main)
    assert during == stalled  # nothing finalized while split 2|2
