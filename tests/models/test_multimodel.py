"""Two models in one swarm (issue 15): two tiny random Llamas (``make_tiny`` seeds 0 and 1, so two model ids)
served by real in-process nodes (real libp2p on 127.0.0.1, real LevelDB, real torch). A client of each model gets
the tokens of that model in one process, routes never mix the two models' servers, a committee member that holds
only model A fetches model B's blocks by content hash over libp2p and votes VALID on a B receipt, and a block
whose bytes do not match the manifest's hash is refused (fetched from another peer, else the member abstains)."""

from __future__ import annotations

import shutil
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
from safetensors.torch import load_file, save_file

from node.blobs import BlobStore
from node.compute.executor import TorchExecutor
from node.compute.model import block_file, load_manifest, make_tiny, tensors_hash
from node.compute.reference import local_generate
from node.compute.span import SpanModel
from node.identity import Identity
from node.ledger.core.status import VALID_S
from node.ledger.core.tx import ABSTAIN, INVALID, VALID, Receipt
from node.models.lookup import UnknownModel
from node.runtime import Node
from node.verify.blockfetch import BLOCK_PROTOCOL, REQUEST_MAX, BlockFetcher, BlockUnavailable, HeldModels
from node.verify.member import CommitteeMember
from tests.e2e.swarm import node_config, tiny_genesis, wait_final
from tests.p2p.util import running_hosts

PROMPT = [5, 17, 42, 99, 7]
NEW = 6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    return cache, make_tiny(cache, seed=0), make_tiny(cache, seed=1)


async def http(method: str, url: str, **kw) -> httpx.Response:
    return await trio.to_thread.run_sync(lambda: httpx.request(method, url, timeout=60, **kw))


# receipts sampled with probability 1e-6 (the floor allowed for these prices): no ledger committee runs beside the
# member this test drives (the slow test below runs them)
QUIET = tiny_genesis(4, price_per_token_block=1, max_receipt_price=1000, sample_base_ppm=1, sample_floor_ppm=1)
LAYOUT = {1: 0, 2: 0, 3: 1, 4: 1}  # node -> model (0: A, 1: B); node 0 is the validator and client, model A
SPANS = {1: (0, 3), 2: (3, 6), 3: (0, 3), 4: (3, 6)}


@asynccontextmanager
async def two_model_swarm(tmp, dirs, genesis=None):
    """Node 0 (validator and client, holding model A only) and servers 1-2 of model A, 3-4 of model B, until every
    span is announced to node 0; yields the nodes."""
    genesis = genesis or tiny_genesis(4)
    ids = [load_manifest(d).model_id for d in dirs]
    async with trio.open_nursery() as n:
        nodes = [Node(node_config(tmp, 0, genesis, dirs[0]))]
        n.start_soon(nodes[0].run)
        await nodes[0].started.wait()
        for i, m in LAYOUT.items():
            cfg = node_config(tmp, i, genesis, dirs[m], span=SPANS[i])
            cfg.bootstrap = nodes[0].host.addrs
            nodes.append(Node(cfg))
            n.start_soon(nodes[i].run)
        for nd in nodes:
            await nd.started.wait()
        # every span announced to node 0 (the client) and node 1 (a member of model A: it fetches model B only
        # once B's bonded servers are announced to it)
        while any(len(nodes[k].swarm.live(mid)) < 2 for mid in ids for k in (0, 1)):
            await trio.sleep(0.1)
        try:
            yield nodes
        finally:
            n.cancel_scope.cancel()


def test_two_models_one_swarm(tmp_path, models):
    _, a_dir, b_dir = models
    a, b = load_manifest(a_dir), load_manifest(b_dir)
    assert a.model_id != b.model_id

    async def main():
        with trio.fail_after(120):
            async with two_model_swarm(tmp_path, (a_dir, b_dir), QUIET) as nodes:
                c = nodes[0]
                out = {"peers": {i: nd.ident.peer_id for i, nd in enumerate(nodes)}}
                out["gen_a"] = await c.generate(PROMPT, NEW)
                out["gen_b"] = await c.generate(PROMPT, NEW, model="tiny-1")  # by name, from the node's cache
                out["route_b_by_id"] = c.client_for(b.model_id.hex()[:12]).route()
                with pytest.raises(UnknownModel, match="node model add"):
                    c.client_for("no-such-model")
                auth = {"Authorization": f"Bearer {c.api_token}"}
                api = await http("POST", f"{c.api_url}/v1/generate", headers=auth,
                                 json={"prompt_ids": PROMPT, "max_new_tokens": NEW, "model": b.model_id.hex()})
                out["api_b"] = (api.status_code, api.json())
                bad = await http("POST", f"{c.api_url}/v1/generate", headers=auth,
                                 json={"prompt_ids": PROMPT, "max_new_tokens": NEW, "model": "no-such-model"})
                out["api_unknown"] = (bad.status_code, bad.json())
                # node 1 holds model A only: re-executing B's receipts makes it fetch B's blocks from peers
                # (its ledger committees may be doing the same at once: the fetcher fetches each block once)
                member = nodes[1].member
                out["member_model"] = nodes[1].manifest.model_id
                out["verdicts"] = [await member.check(r) for r in out["gen_b"].receipts]
                out["refused"] = list(member.fetcher.refused)
                return out

    out = trio.run(main)
    peers = out["peers"]
    a_servers, b_servers = {peers[1], peers[2]}, {peers[3], peers[4]}
    gen_a, gen_b = out["gen_a"], out["gen_b"]
    assert gen_a.tokens == local_generate(a_dir, PROMPT, NEW)
    assert gen_b.tokens == local_generate(b_dir, PROMPT, NEW)
    assert gen_a.tokens != gen_b.tokens  # two different models: the comparison above can tell them apart
    assert {p for p, _, _ in gen_a.route} == a_servers and {p for p, _, _ in gen_b.route} == b_servers
    assert {p for p, _, _ in out["route_b_by_id"]} == b_servers
    assert all(r.model_id == a.model_id for r in gen_a.receipts)
    assert all(r.model_id == b.model_id for r in gen_b.receipts) and len(gen_b.receipts) == 2
    status, body = out["api_b"]
    assert status == 200 and body["tokens"] == gen_b.tokens
    assert {s["peer"] for s in body["route"]} == b_servers
    assert out["api_unknown"][0] == 404 and out["api_unknown"][1]["code"] == "unknown_model"
    assert out["member_model"] == a.model_id
    assert [v for v, _ in out["verdicts"]] == [VALID, VALID] and out["refused"] == []
    fetched = tmp_path / "n1" / "models" / b.model_id.hex()
    assert sorted(p.name for p in fetched.glob("block_*")) == [block_file(i) for i in range(6)]
    for i in range(6):  # byte-identical to model B's own blocks
        assert (fetched / block_file(i)).read_bytes() == (b_dir / block_file(i)).read_bytes()


@pytest.mark.slow
def test_ledger_committees_of_the_other_model_fetch_and_vote(tmp_path, models):
    """Through the ledger: every receipt is sampled, and a committee of 2 drawn from the 3 bonded nodes other
    than the worker always holds a server of the other model. Each B receipt ends VALID with a VALID vote from a
    node that holds only model A (and fetched B's blocks to cast it); likewise for A receipts."""
    _, a_dir, b_dir = models

    async def main():
        with trio.fail_after(150):
            async with two_model_swarm(tmp_path, (a_dir, b_dir)) as nodes:
                c = nodes[0]
                gens = [await c.generate(PROMPT, NEW), await c.generate(PROMPT, NEW, model="tiny-1")]
                recs = await wait_final(c, [r.id for g in gens for r in g.receipts], timeout=120)
                holders = {nd.ident.account: nd.manifest.model_id for nd in nodes[1:]}
                return recs, holders

    recs, holders = trio.run(main)
    assert len(recs) == 4
    for rec in recs.values():
        assert rec.status == VALID_S
        others = [v for v, _, verdict, _ in rec.votes if verdict == VALID and holders[v] != rec.receipt.model_id]
        assert others, "no VALID vote from a node of the other model"


def tampered_copy(src, dst, index: int):
    """A copy of model dir ``src`` whose block ``index`` is still valid safetensors but holds other weights."""
    shutil.copytree(src, dst)
    path = dst / block_file(index)
    sd = load_file(str(path))
    name = sorted(sd)[0]
    sd[name] = sd[name] + 1e-3
    save_file(sd, str(path))
    return dst


def receipt_of(model_id: bytes, start: int, end: int) -> Receipt:
    w, r = Identity.generate(), Identity.generate()
    return Receipt("tally-test", b"\x01" * 16, w.account, r.account, model_id, start, end, 3, b"\x02" * 32,
                   b"\x03" * 32, 1, 0)


def test_corrupted_block_is_refused_by_hash(tmp_path, models):
    _, a_dir, b_dir = models
    a, b = load_manifest(a_dir), load_manifest(b_dir)
    bad_dir = tampered_copy(b_dir, tmp_path / "bad", 1)
    assert tensors_hash(load_file(str(bad_dir / block_file(1)))) != b.block_hashes[1]

    async def main():
        with trio.fail_after(60):
            async with running_hosts(4) as (bad, good, member_host, lone_host):
                bad.set_request_handler(BLOCK_PROTOCOL, HeldModels(bad_dir, tmp_path / "bad-f").handle,
                                        max_message=REQUEST_MAX)
                good.set_request_handler(BLOCK_PROTOCOL, HeldModels(b_dir, tmp_path / "good-f").handle,
                                         max_message=REQUEST_MAX)
                for h in (member_host, lone_host):
                    assert await h.connect(bad.addrs + good.addrs) == 2
                out = {}
                # the corrupted peer is asked first: its block 1 is refused and the good peer's copy is used
                f = BlockFetcher(member_host, tmp_path / "m1", lambda mid, i: [bad.peer_id, good.peer_id],
                                 timeout=10)
                out["dir"] = await f.ensure(b.model_id, 0, 3)
                out["refused"] = list(f.refused)
                # only the corrupted peer: the block cannot be had, and the member abstains
                lone = BlockFetcher(lone_host, tmp_path / "m2", lambda mid, i: [bad.peer_id], timeout=10)
                with pytest.raises(BlockUnavailable, match="block 1"):
                    await lone.ensure(b.model_id, 0, 3)
                member = CommitteeMember(Identity.generate(), None, lone_host, BlobStore(tmp_path / "m2blobs"),
                                         TorchExecutor(1), lambda s, e: SpanModel(a_dir, s, e), a.model_id,
                                         fetcher=lone)
                out["verdict"] = await member.check(receipt_of(b.model_id, 0, 3))
                # a model nobody holds: abstain without a manifest
                out["unknown"] = await member.check(receipt_of(b"\x07" * 32, 0, 3))
                # a peer asked for model B's manifest cannot pass off another model's
                other = HeldModels(a_dir, tmp_path / "a-f")
                other._own = {b.model_id: a_dir}
                bad.set_request_handler(BLOCK_PROTOCOL, other.handle, max_message=REQUEST_MAX)
                liar = BlockFetcher(lone_host, tmp_path / "m3", lambda mid, i: [bad.peer_id], timeout=10)
                with pytest.raises(BlockUnavailable, match="refused"):
                    await liar.manifest(b.model_id)
                out["liar_refused"] = list(liar.refused)
                return out

    out = trio.run(main)
    d = out["dir"]
    assert [p for p, _ in out["refused"]] and all("block 1" in why for _, why in out["refused"])
    assert (d / block_file(1)).read_bytes() == (b_dir / block_file(1)).read_bytes()
    assert SpanModel(d, 0, 3).model_id == b.model_id  # the fetched span loads (each block hash-checked again)
    m2 = tmp_path / "m2" / b.model_id.hex()
    assert (m2 / block_file(0)).is_file() and not (m2 / block_file(1)).exists()  # nothing unchecked is kept
    assert out["verdict"][0] == ABSTAIN and out["unknown"][0] == ABSTAIN
    assert out["liar_refused"] and "manifest" in out["liar_refused"][0][1]
    assert not (tmp_path / "m3" / b.model_id.hex()).exists()


def test_a_member_of_another_model_fetches_the_whole_model_and_replays_a_training_segment(tmp_path, models):
    """Jobs and runs of model B verified by a node of model A: :meth:`BlockFetcher.ensure_model` brings every block
    and the head of B over real libp2p (a peer whose head has other weights is refused by hash, the next one
    asked) and marks the dir's tokenizer as a peer's. A training segment of a B job replayed there gets the
    verdict and distance of a replay on B's own dir; batches that differ from the receipt's are INVALID on B's
    own dir but only ABSTAIN on the fetched one (a peer's tokenizer may be the wrong one)."""
    from dataclasses import replace

    from node.compute.model import HEAD_FILE
    from node.market.check import replay_segment
    from node.verify.blockfetch import UNVERIFIED_TOKENIZER, tokenizer_trusted
    from tests.verify.test_training import TEXT, post, work

    _, _, b_dir = models
    b = load_manifest(b_dir)
    bad_dir = tmp_path / "bad"
    shutil.copytree(b_dir, bad_dir)
    head = load_file(str(bad_dir / HEAD_FILE))
    first = sorted(head)[0]
    head[first] = head[first] + 1e-3
    save_file(head, str(bad_dir / HEAD_FILE))

    async def main():
        with trio.fail_after(60):
            async with running_hosts(3) as (bad, good, member_host):
                for h, d in ((bad, bad_dir), (good, b_dir)):
                    h.set_request_handler(BLOCK_PROTOCOL, HeldModels(d, tmp_path / f"{h.peer_id[-6:]}-f").handle,
                                          max_message=REQUEST_MAX)
                assert await member_host.connect(bad.addrs + good.addrs) == 2
                f = BlockFetcher(member_host, tmp_path / "fetched", lambda mid, i: [bad.peer_id, good.peer_id],
                                 timeout=10)
                d = await f.ensure_model(b.model_id)
                return d, list(f.refused)

    d, refused = trio.run(main)
    assert [why for _, why in refused] and all("head" in why for _, why in refused)
    for name in [HEAD_FILE, *(block_file(i) for i in range(b.num_blocks))]:
        assert (d / name).read_bytes() == (b_dir / name).read_bytes(), name
    assert (d / UNVERIFIED_TOKENIZER).is_file() and not tokenizer_trusted(d) and tokenizer_trusted(b_dir)
    p = post(model_id=b.model_id)
    r, s0, s1 = work(b_dir, p)
    own, fetched = replay_segment(b_dir, p, TEXT, r, s0, s1), replay_segment(d, p, TEXT, r, s0, s1)
    assert own[0] == VALID and fetched == own
    wrong = replace(r, batches_root=b"\x07" * 32)
    assert replay_segment(b_dir, p, TEXT, wrong, s0, s1)[0] == INVALID
    assert replay_segment(d, p, TEXT, wrong, s0, s1)[0] == ABSTAIN
