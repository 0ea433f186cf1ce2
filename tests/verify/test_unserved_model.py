"""Issue 24, check 5: a committee asked to verify a receipt for a model nobody serves abstains without downloading
anything. Real nodes (in-process :class:`~node.runtime.Node`: real libp2p on 127.0.0.1, real LevelDB, the tiny
model), every receipt sampled: two bonded accounts (requester and worker, as an attacker holds them) sign a receipt
for an invented model and submit it. The worker's node even serves the invented model's files over the block
protocol (a real model dir nobody announces), as an attacker would, to make members download: before bounded
fetches every member fetched it from the worker. Now the committee drawn from the other bonded nodes asks for
nothing and votes ABSTAIN, the receipt settles unverified, no node writes anything under ``<data dir>/models/``,
no honest bond changes and credits are conserved in the reopened LevelDB."""

from __future__ import annotations

import os

import pytest
import trio

from node.compute.model import load_manifest, make_tiny
from node.encoding import H
from node.identity import Identity, dev_seed
from node.ledger.core.state import genesis_state
from node.ledger.core.status import UNVERIFIED
from node.ledger.core.tx import ABSTAIN, Receipt
from node.ledger.store import LedgerStore
from tests.e2e.swarm import swarm, tiny_genesis, wait_final


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    return make_tiny(cache), make_tiny(cache, seed=7)


def test_a_receipt_for_an_invented_model_gets_abstentions_and_no_download(tmp_path, tiny):
    tiny_dir, invented_dir = tiny
    g = tiny_genesis(3)
    assert g.params.sample_base_ppm == 10**6 and g.params.model_servers() == 1  # every receipt is sampled
    invented = load_manifest(invented_dir).model_id
    requester, worker = Identity.from_seed(dev_seed(0)), Identity.from_seed(dev_seed(1))

    async def main():
        with trio.fail_after(240):
            async with swarm(tmp_path, tiny_dir, [(0, 3), (3, 6), (0, 6)], genesis=g) as nodes:
                c = nodes[0]
                nodes[1].held.add(invented_dir)  # the worker serves the invented model's files, unannounced
                assert all(not n.swarm.live(invented) for n in nodes)
                tokens, start, end = 4, 0, 3
                r = Receipt(chain_id=g.domain, session_id=os.urandom(16), worker=worker.account,
                            requester=requester.account, model_id=invented, span_start=start, span_end=end,
                            tokens=tokens, inputs_root=H(b"in"), outputs_root=H(b"out"),
                            price=tokens * (end - start) * g.params.price_per_token_block,
                            opened_height=c.ledger.state.height)
                r = r.sign_worker(worker).countersign(requester)
                await c.ledger.submit(r)
                recs = await wait_final(c, [r.id], timeout=200)
                return recs[r.id], c.ledger.state.supply()

    rec, supply = trio.run(main)
    assert rec.status == UNVERIFIED
    assert len(rec.votes) >= 2 and {verdict for _, _, verdict, _ in rec.votes} == {ABSTAIN}
    assert worker.account not in {v for v, _, _, _ in rec.votes}
    for i in range(4):
        models = tmp_path / f"n{i}" / "models"
        assert not models.exists() or list(models.iterdir()) == [], f"node {i} wrote {list(models.rglob('*'))}"
    genesis_supply = genesis_state(g).supply()
    assert supply == genesis_supply
    store = LedgerStore(tmp_path / "n0" / "ledger", g)
    try:
        state = store.replay()
        reopened = (state.supply(), state.receipts[rec.receipt.id].status,
                    {v: state.account(v).bond for v, _, _, _ in rec.votes})
    finally:
        store.close()
    assert reopened[0] == genesis_supply and reopened[1] == UNVERIFIED
    # an abstaining member loses nothing
    assert reopened[2] == {v: genesis_state(g).account(v).bond for v, _, _, _ in rec.votes}


@pytest.mark.slow
def test_a_stalled_fetch_of_another_model_does_not_hold_back_votes_on_the_own_model(tmp_path, tiny):
    """A bonded attacker serves model X (announced, so members do fetch it) but never answers block requests, and
    posts a receipt for X. The members drawn for it are stuck fetching X (until the request timeout, 60 s), yet
    receipts of their own model, generated after it, get their votes and become final before X's receipt gets
    any: the member checks its own model's receipts in a lane of their own (one sequential loop held them all)."""
    from node.ledger.core.status import VALID_S
    from node.verify.blockfetch import BLOCK_PROTOCOL

    tiny_dir, x_dir = tiny
    g = tiny_genesis(4)
    x = load_manifest(x_dir).model_id
    requester, worker = Identity.from_seed(dev_seed(0)), Identity.from_seed(dev_seed(4))

    async def stall(stream, peer: str) -> None:
        await trio.sleep_forever()

    async def main():
        with trio.fail_after(200):
            spans = [(0, 3), (3, 6), (0, 6)]
            async with swarm(tmp_path, tiny_dir, spans, genesis=g) as nodes:
                from node.runtime import Node
                from tests.e2e.swarm import node_config

                cfg = node_config(tmp_path, 4, g, x_dir, span=(0, 6))
                cfg.bootstrap = nodes[0].host.addrs
                attacker = Node(cfg)
                async with trio.open_nursery() as n:
                    n.start_soon(attacker.run)
                    await attacker.started.wait()
                    attacker.host.set_handler(BLOCK_PROTOCOL, stall)
                    while not all(nd.swarm.live(x) for nd in nodes[1:]):
                        await trio.sleep(0.1)
                    c = nodes[0]
                    r = Receipt(chain_id=g.domain, session_id=os.urandom(16), worker=worker.account,
                                requester=requester.account, model_id=x, span_start=0, span_end=6, tokens=2,
                                inputs_root=H(b"in"), outputs_root=H(b"out"),
                                price=2 * 6 * g.params.price_per_token_block, opened_height=c.ledger.state.height)
                    r = r.sign_worker(worker).countersign(requester)
                    await c.ledger.submit(r)
                    with trio.fail_after(30):  # included, then sampled: its committee is drawn
                        while not getattr(c.ledger.state.receipts.get(r.id), "committee", None):
                            await c.ledger.new_block.wait()
                    await trio.sleep(1.0)  # the members take it from their queue and start fetching X
                    stuck = set(c.ledger.state.receipts[r.id].committee)
                    own: dict = {}
                    for _ in range(4):  # a generation's committees may all miss the stuck members: draw again
                        gen = await c.generate([5, 17, 42], 4)
                        own.update(await wait_final(c, [x.id for x in gen.receipts], timeout=50))
                        if {v for rec in own.values() for v, _, _, _ in rec.votes} & stuck:
                            break
                    x_votes = c.ledger.state.receipts[r.id].votes
                    n.cancel_scope.cancel()
                return stuck, own, x_votes

    stuck, own, x_votes = trio.run(main)
    assert own and x_votes == ()  # the members drawn for X are still fetching it
    assert all(rec.status == VALID_S for rec in own.values())
    voters = {v for rec in own.values() for v, _, _, _ in rec.votes}
    assert voters & stuck, "no member stuck on X voted on an own-model receipt in 4 generations"
