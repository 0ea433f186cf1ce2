"""Batch jobs on real nodes (libp2p on 127.0.0.1, LevelDB, torch, tiny model): a requester posts a file, five bonded
workers (one running a test switch) fetch it, run, commit, reveal; the ledger votes; the requester fetches the
accepted results from the agreeing workers. Every accepted result equals the same work done in one process, the
cheating worker is slashed on every item it was drawn for, and credits are conserved."""

from __future__ import annotations

import json
from functools import partial

import pytest
import trio

from node.batch.client import batch_json, fetch_results, post_batch
from node.batch.tasks import ItemRunner
from node.compute.model import make_tiny
from node.identity import account_to_str
from node.compute.reference import load_causal_lm, local_generate
from node.ledger.core.batchstate import BatchStatus, Fate
from node.runtime import Node

from ..e2e.swarm import C, node_config, tiny_genesis

N_WORKERS = 5
CHEAT = 5  # node index of the cheating worker


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


async def run_batch(tmp, model_dir, data: bytes, kind: str, fault: str, timeout: float = 240, **post):
    g = tiny_genesis(N_WORKERS, batch_slash=10 * C)
    async with trio.open_nursery() as n:
        nodes = [Node(node_config(tmp, 0, g, model_dir))]
        n.start_soon(nodes[0].run)
        await nodes[0].started.wait()
        for i in range(1, N_WORKERS + 1):
            cfg = node_config(tmp, i, g, model_dir, fault=fault if i == CHEAT else None)
            cfg.bootstrap = nodes[0].host.addrs
            nodes.append(Node(cfg))
            n.start_soon(nodes[i].run)
        for nd in nodes:
            await nd.started.wait()
        req = nodes[0]
        post = {"commit_window": 400, "reveal_window": 200, **post}  # wide: loaded cores; all-in closes early
        p = await post_batch(req, data, kind=kind, replication=3, price=10**6, **post)
        with trio.fail_after(timeout):
            while True:
                b = req.ledger.state.tables["batches"].get(p.batch_id)
                if b is not None and b.status == BatchStatus.SETTLED:
                    break
                await req.ledger.new_block.wait()
        rows = await fetch_results(req, p.batch_id)
        st = req.ledger.state.detach()
        n.cancel_scope.cancel()
    accounts = [nd.ident.account for nd in nodes]
    return p, rows, st, g, accounts


def _check_votes(st, g, p, accounts, rows):
    from node.batch.client import items_of

    b = st.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.SETTLED and b.decided == p.n_items
    assert b.accepted == p.n_items and len(rows) == p.n_items  # the honest majority decided every item
    cheat = accounts[CHEAT]
    cheat_items = [it for it in items_of(st, b) if cheat in it.workers]
    assert cheat_items, "the beacon drew the cheat for no item (try another seed)"
    for it in items_of(st, b):
        fates = {w: f for _a, w, f, _x in it.history}
        assert cheat not in it.agreed
        if cheat in fates:
            assert fates[cheat] == Fate.DISSENTED
        assert all(f == Fate.AGREED for w, f in fates.items() if w != cheat), fates
    taken = min(200 * C, 10 * C * len(cheat_items))  # each dissent takes min(bond, batch_slash)
    assert st.account(cheat).bond == 200 * C - taken and st.account(cheat).slashed == taken
    assert st.supply() == g.supply  # credits conserved
    j = batch_json(b, st)
    assert j["fates"]["dissented"] == len(cheat_items) and j["progress"] == 1.0
    assert j["agreement_rate"] == pytest.approx(1 - len(cheat_items) / (3 * p.n_items))
    cheat_peer = account_to_str(cheat)
    for r in rows:  # the workers listed are the ones that agreed: two when the cheat was drawn, else three
        it = items_of(st, b)[r["item"]]
        assert r["workers"] == [account_to_str(w) for w in it.agreed] and cheat_peer not in r["workers"]
        assert len(r["workers"]) == (2 if cheat in it.workers else 3)
    return cheat_items


@pytest.mark.slow  # 15-30 s on a quiet 2-core machine (six nodes in one process); minutes under load
@pytest.mark.quarantine  # passed at load <= 2.5 (15-70 s); failed at load 8-9 and once in the whole slow step
# (the requester's result fetch: stream opens to the workers). Next: nodes as processes; see the session note
def test_generate_batch_corrupt_worker_outvoted(tmp_path, tiny):
    prompts = [f"Shall I compare thee {i}" for i in range(10)]
    data = "".join(json.dumps({"prompt": t}) + "\n" for t in prompts).encode()
    p, rows, st, g, accounts = trio.run(partial(run_batch, tmp_path, tiny, data, "generate", "corrupt", max_tokens=4))
    _check_votes(st, g, p, accounts, rows)
    model = load_causal_lm(tiny)
    runner = ItemRunner(tiny)
    for r in rows:  # every accepted result equals greedy generation in this one process
        want = local_generate(tiny, runner.tokenize(prompts[r["item"]]), 4, model=model)
        assert r["result"]["ids"] == want, r
        assert r["input"] == {"prompt": prompts[r["item"]]}


@pytest.mark.slow  # 15-30 s on a quiet 2-core machine (six nodes in one process); minutes under load
@pytest.mark.quarantine  # passed at load <= 2.5 (15-70 s); failed at load 8-9 and once in the whole slow step
# (the requester's result fetch: stream opens to the workers). Next: nodes as processes; see the session note
def test_score_batch_bf16_worker_outvoted(tmp_path, tiny):
    texts = [f"To be, or not to be, that is the question {i}" for i in range(10)]
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    p, rows, st, g, accounts = trio.run(run_batch, tmp_path, tiny, data, "score", "bf16")
    _check_votes(st, g, p, accounts, rows)
    runner = ItemRunner(tiny)
    for r in rows:  # within the grid of one-process float32 log-likelihoods
        want = runner.log_likelihoods(runner.tokenize(texts[r["item"]]))
        got = r["result"]["logprobs"]
        assert len(got) == len(want)
        assert max(abs(a - b) for a, b in zip(got, want)) <= r["result"]["grid"] / 2 + 1e-9

