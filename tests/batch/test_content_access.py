"""Batch content is served only to those who need it (issue 23, finding 5): an item file to the batch's requester,
its drawn workers and auditors; a result to the requester. Anyone else gets ``forbidden``, before it learns
whether the content is held. Real nodes (libp2p on 127.0.0.1, LevelDB, the tiny model) and a peer that passed the
genesis handshake but was never drawn."""

from __future__ import annotations

import json

import pytest
import trio

from node.batch.client import fetch_results, items_of, post_batch
from node.batch.content import BATCH_PROTOCOL, MAX_CONTENT
from node.compute.model import make_tiny
from node.identity import Identity
from node.ledger.core.batchstate import BatchStatus
from node.net.service import NetworkService
from node.p2p.framing import RemoteError
from node.p2p.host import P2PHost
from node.runtime import Node

from ..e2e.swarm import C, node_config, tiny_genesis
from .offers import wait_offers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_batch_content_goes_to_the_requester_drawn_workers_and_no_one_else(tmp_path, tiny):
    g = tiny_genesis(2, batch_slash=10 * C)
    data = "".join(json.dumps({"prompt": f"Now is the winter {i}"}) + "\n" for i in range(2)).encode()

    async def main():
        async with trio.open_nursery() as n:
            nodes = []
            for i in range(3):
                cfg = node_config(tmp_path, i, g, tiny)
                if i:
                    cfg.bootstrap = nodes[0].host.addrs
                    cfg.accept_batches = True
                nd = Node(cfg)
                n.start_soon(nd.run)
                await nd.started.wait()
                nodes.append(nd)
            req, w1, w2 = nodes
            await wait_offers(req, [w1.ident.account, w2.ident.account])
            p = await post_batch(req, data, kind="generate", replication=2, quorum=2, price=10**6, max_tokens=3,
                                 commit_window=20, reveal_window=40)
            with trio.fail_after(120):
                while (b := req.ledger.state.tables["batches"].get(p.batch_id)) is None \
                        or b.status != BatchStatus.SETTLED:
                    await req.ledger.new_block.wait()
            rows = await fetch_results(req, p.batch_id)  # the requester gets every result (it names the batch)
            items = items_of(req.ledger.state, b)
            result = items[0].result
            assert {w1.ident.account, w2.ident.account} <= set(items[0].workers) | set(items[0].tried)

            outsider = P2PHost(Identity.generate(), 0, g.chain_id, genesis_hash=g.hash)
            net = NetworkService(outsider, g.hash)
            codes = {}
            async with outsider.running():
                await outsider.start_service(net.run)
                assert await outsider.connect(req.host.addrs) == 1
                assert await outsider.connect(w1.host.addrs) == 1
                with trio.fail_after(30):
                    while not (net.hello.verified(req.ident.peer_id) and net.hello.verified(w1.ident.peer_id)):
                        await trio.sleep(0.05)

                async def ask(host, target, key, batch=None):
                    msg = {"type": "get", "key": key}
                    if batch is not None:
                        msg["batch"] = batch
                    try:
                        reply = await host.request(target.ident.peer_id, BATCH_PROTOCOL, msg, timeout=20,
                                                   max_message=MAX_CONTENT)
                    except RemoteError as e:
                        return e.code
                    return "ok" if isinstance(reply.get("data"), bytes) else "bad"

                codes["outsider items"] = await ask(outsider, req, p.items_root)
                codes["outsider items, batch named"] = await ask(outsider, req, p.items_root, p.batch_id)
                codes["outsider result"] = await ask(outsider, w1, result, p.batch_id)
                codes["outsider unknown key"] = await ask(outsider, req, b"\x07" * 32)
                codes["outsider bad batch"] = await ask(outsider, req, p.items_root, b"\x01" * 16)
            codes["worker items, batch named"] = await ask(w1.host, req, p.items_root, p.batch_id)
            codes["worker copies a result"] = await ask(w2.host, w1, result, p.batch_id)
            codes["requester result"] = await ask(req.host, w1, result, p.batch_id)
            codes["requester result, open batches only"] = await ask(req.host, w1, result)
            n.cancel_scope.cancel()
        return rows, codes

    rows, codes = trio.run(main)
    assert len(rows) == 2 and all("ids" in r["result"] for r in rows)
    assert codes == {
        "outsider items": "forbidden",
        "outsider items, batch named": "forbidden",
        "outsider result": "forbidden",
        "outsider unknown key": "forbidden",  # nothing said about whether it is held
        "outsider bad batch": "forbidden",
        "worker items, batch named": "ok",  # a drawn worker, the batch settled
        "worker copies a result": "forbidden",  # results go to the requester only
        "requester result": "ok",
        "requester result, open batches only": "forbidden",  # a settled batch must be named
    }, codes
