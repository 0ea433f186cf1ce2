"""Issue 36, check 3 at the lowest level that proves it: a server with an empty model cache fetches its span from
the nodes that serve the model (``node model fetch``'s :func:`fetch_model`: real libp2p on 127.0.0.1, the genesis
handshake, every file checked against the model id), registers it, and serves it: the only route goes through it,
the tokens equal one process, and its receipts are voted valid."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from node.compute.model import HEAD_FILE, block_file, load_manifest
from node.compute.reference import local_generate
from node.ledger.core.state import VALID_S
from node.ledger.core.tx import VALID
from node.models.convert import add_model
from node.models.lookup import model_dir_of
from node.models.registry import load as load_registry
from node.runtime import Node
from node.verify.modelfetch import FetchError, fetch_model

from ..e2e.swarm import node_config, swarm, tiny_genesis, wait_final
from ..models.synth_gguf import write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    src = write_llama_gguf(d / "m.gguf", blocks=4, hidden=256, ffn=512, heads=4, kv_heads=2, type_name="Q4_K")
    return model_dir_of(add_model(src, d / "cache").name, d / "cache")


def test_a_server_with_an_empty_cache_fetches_its_span_and_serves_it(tmp_path, gguf_model):
    genesis = tiny_genesis(3)  # dev keys 1-3 bonded; 1 and 2 serve the ends, 3 starts empty
    cache = tmp_path / "empty-cache"
    mid = load_manifest(gguf_model).model_id

    async def main():
        async with swarm(tmp_path, gguf_model, [(0, 1), (3, 4)], genesis=genesis) as nodes:
            client = nodes[0]
            addrs = [nd.host.addrs[0] for nd in nodes[1:]]
            with pytest.raises(FetchError, match=r"is not inside model"):
                await fetch_model(genesis, addrs, mid, tmp_path / "other", "bad", range(2, 9))
            entry = await fetch_model(genesis, addrs, mid, cache, "fetched", range(1, 3))
            d = cache / entry.dir
            cfg = replace(node_config(tmp_path, 3, genesis, d, span=(1, 3)), bootstrap=client.host.addrs,
                          warm_head=False)  # a server builds no head (node start --span's default)
            fifth = Node(cfg)
            async with trio.open_nursery() as n:
                n.start_soon(fifth.run)
                await fifth.started.wait()
                with trio.fail_after(30):
                    while len(client.swarm.live(mid)) < 3:
                        await trio.sleep(0.1)
                gen = await client.generate([7, 8, 9], 4)
                recs = await wait_final(client, [r.id for r in gen.receipts], timeout=90)
                n.cancel_scope.cancel()
            return entry, d, gen, recs, fifth.ident.account

    entry, d, gen, recs, fifth = trio.run(main)
    assert sorted(p.name for p in d.glob("block_*")) == [block_file(1), block_file(2)]  # only its span
    assert not (d / HEAD_FILE).exists() and load_manifest(d).model_id == load_manifest(gguf_model).model_id
    assert [e.name for e in load_registry(cache)] == ["fetched"] and entry.source.startswith("fetched from /ip4/")
    assert gen.tokens == local_generate(gguf_model, [7, 8, 9], 4)
    assert [(s, e) for _p, s, e in gen.route] == [(0, 1), (1, 3), (3, 4)]
    mine = [r for r in gen.receipts if r.worker == fifth]
    assert mine and all(rec.status == VALID_S for rec in recs.values())
    # on the others' receipts (blocks 0 and 3, which it never fetched for itself) the fifth node sat on the
    # committee: it fetched those blocks from peers, re-executed them and voted valid, not abstained
    checked = [rec for rec in recs.values() if rec.receipt.worker != fifth and fifth in rec.committee]
    assert checked and all(verdict == VALID for rec in checked for voter, _r, verdict, _d in rec.votes
                           if voter == fifth), [rec.votes for rec in checked]
    assert all(any(voter == fifth for voter, *_ in rec.votes) for rec in checked)
    assert not (tmp_path / "other").exists() or not load_registry(tmp_path / "other")  # the refused fetch: nothing


NOBODY = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWSb8MMzSsKLLjEZDtwCKiaj2VMzoHgmeh5H6hZv44ijQV"  # nothing listens there


def test_the_cli_refuses_a_bad_id_and_an_unreachable_peer(tmp_path):
    base = [sys.executable, "-m", "node.cli", "model", "fetch", "--model-cache", str(tmp_path)]
    r = subprocess.run(base + ["abc", "--from", NOBODY], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "64 hex digits" in r.stderr
    r = subprocess.run(base + ["ab" * 32, "--from", NOBODY], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 1 and "could be reached" in r.stderr, r.stderr[-2000:]
    assert load_registry(tmp_path) == []
