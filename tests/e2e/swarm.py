"""An in-process swarm of real nodes (real libp2p on 127.0.0.1, real LevelDB, real torch, tiny model)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

import trio

from node.config import NodeConfig
from node.identity import Identity, dev_seed
from node.ledger.genesis import Genesis, Params
from node.runtime import Node

C = 10**9


def tiny_genesis(n_servers: int = 3, **params) -> Genesis:
    keys = [Identity.from_seed(dev_seed(i)) for i in range(n_servers + 1)]
    p = Params(**{"block_time_ms": 150, "price_per_token_block": 100_000, "max_receipt_price": 50 * C,
                  "committee_size": 2, "verdict_timeout": 600, **params})
    bal = [(keys[0].account, 1000 * C, 0)] + [(k.account, 100 * C, 200 * C) for k in keys[1:]]
    return Genesis("tally-test", 0, (keys[0].account,), tuple(bal), p)


def node_config(tmp: Path, i: int, genesis: Genesis, model_dir: Path, span=None, fault=None,
                accept_jobs=False, step_timeout: float = 10.0, discovery: str = "gossip") -> NodeConfig:
    return NodeConfig(data_dir=tmp / f"n{i}", genesis=genesis, model_dir=model_dir, span=span,
                      seed=dev_seed(i), fault=fault, step_timeout=step_timeout, announce_period=0.5,
                      accept_jobs=accept_jobs, discovery=discovery, record_period=2.0)


@asynccontextmanager
async def swarm(tmp: Path, model_dir: Path, spans, genesis: Genesis | None = None, faults=None, accept_jobs=(),
                budgets=None, step_timeout: float = 10.0, discovery: str = "gossip"):
    """Start node 0 (validator + client) and one server per span; yield the list of nodes.
    ``accept_jobs``: indexes of servers that take fine-tune jobs; ``budgets``: index -> MemoryBudget of a server;
    ``step_timeout``: every node's (a client's wait for a reply, a server's wait for a session's next message);
    ``discovery``: every node's (``"dht"``: node 0 looks the spans up until it has them all)."""
    genesis = genesis or tiny_genesis(len(spans))
    faults = faults or {}
    async with trio.open_nursery() as n:
        nodes = [Node(node_config(tmp, 0, genesis, model_dir, step_timeout=step_timeout, discovery=discovery))]
        n.start_soon(nodes[0].run)
        await nodes[0].started.wait()
        boot = nodes[0].host.addrs
        for i, span in enumerate(spans, start=1):
            cfg = node_config(tmp, i, genesis, model_dir, span=span, fault=faults.get(i),
                              accept_jobs=i in accept_jobs, step_timeout=step_timeout, discovery=discovery)
            cfg.bootstrap = boot
            cfg.budget = (budgets or {}).get(i)
            nd = Node(cfg)
            nodes.append(nd)
            n.start_soon(nd.run)
        for nd in nodes:
            await nd.started.wait()
        # every span announced to (or looked up by) the client: 60 s, as the README suite on a loaded machine took
        # more than 20 s to publish and look up five DHT records (a lookup's dials and Noise handshakes)
        with trio.fail_after(60):
            while len(nodes[0].swarm.live(nodes[0].manifest.model_id)) < len(spans):
                if nodes[0].dht_feed is not None:
                    await nodes[0].dht_feed.route(nodes[0].manifest.model_id, 0, nodes[0].manifest.num_blocks, True)
                await trio.sleep(0.1)
        try:
            yield nodes
        finally:
            n.cancel_scope.cancel()


async def wait_final(node: Node, rids, timeout: float = 30.0) -> dict:
    from node.ledger.core.state import FINAL

    with trio.fail_after(timeout):
        while True:
            recs = {r: node.ledger.state.receipts.get(r) for r in rids}
            if all(x is not None and x.status in FINAL for x in recs.values()):
                return recs
            await node.ledger.new_block.wait()
