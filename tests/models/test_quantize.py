"""``node model add SOURCE --quantize int8`` (node.models.quantize) on the tiny random Llama: its own model id, an
output close to the float model's, 3 servers equal to one process, committees that tell int8 from float, and
refusals of damaged int8 files."""

from __future__ import annotations

import json

import pytest
import torch
import trio

from node.blobs import BlobStore
from node.compute.compare import DEFAULT_TOLERANCE
from node.compute.executor import TorchExecutor
from node.compute.head import ClientHead
from node.compute.int8 import Int8Linear, dequantize_block, quantize_weight
from node.compute.model import ManifestError, block_file, load_manifest, make_tiny
from node.compute.reference import local_generate
from node.compute.span import SpanModel
from node.identity import Identity
from node.inference.server import SpanServer
from node.ledger.core.tx import INVALID, VALID
from node.models import registry
from node.models.cli import main as model_cli
from node.models.convert import add_model
from node.models.sources import CheckpointError
from node.verify.member import CommitteeMember

from ..inference.fakenet import CHAIN, PRICE, FakeLedger, announce, make_swarm

SPANS = [(0, 2), (2, 4), (4, 6)]
PROMPT = [5, 17, 42, 99, 7]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(cache, float dir, int8 dir)``: the tiny model and its int8 copy made by ``node model add tiny --quantize``."""
    cache = tmp_path_factory.mktemp("qcache")
    assert model_cli(["model", "add", "tiny", "--quantize", "int8", "--model-cache", str(cache)]) == 0
    (entry,) = registry.load(cache)
    assert entry.name == "tiny-int8" and entry.quantization == "int8"
    return cache, make_tiny(cache), cache / entry.dir


def _hidden(float_dir):
    return ClientHead(float_dir).embed(torch.tensor([PROMPT]))


def test_int8_copy_is_another_model_close_to_the_float_one(tiny):
    _, fdir, qdir = tiny
    fm, qm = load_manifest(fdir), load_manifest(qdir)
    assert qm.quantization == "int8" and fm.quantization is None
    assert qm.model_id != fm.model_id and set(qm.block_hashes).isdisjoint(fm.block_hashes)
    assert qm.head_hash == fm.head_hash  # embeddings, norm and LM head stay float32
    assert json.loads((qdir / "config.json").read_text())["tally_quantization"] == "int8"
    span_f, span_q = SpanModel(fdir, 0, 6), SpanModel(qdir, 0, 6)
    lin = span_q.net.layers[0].self_attn.q_proj
    assert isinstance(lin, Int8Linear) and lin.weight.dtype == torch.int8
    nbytes = lambda s: sum(t.numel() * t.element_size() for t in [*s.net.parameters(), *s.net.buffers()])  # noqa: E731
    assert nbytes(span_q) < 0.35 * nbytes(span_f), (nbytes(span_q), nbytes(span_f))
    h = _hidden(fdir)
    yf, yq = span_f.prefill(h), span_q.prefill(h)
    rel = float(((yq - yf).norm(dim=-1) / yf.norm(dim=-1)).max())
    # measured 0.041 over the 6 blocks; far above honest float noise (~1e-6), so a
    # committee tells the two apart (DEFAULT_TOLERANCE 1e-3), yet close enough to be the same model's output
    assert DEFAULT_TOLERANCE < rel < 0.1, rel
    # resident int8 (dequantized per matmul) equals dequantize-at-load and the one-process model, bit for bit
    assert torch.equal(yq, SpanModel(qdir, 0, 6, int8_resident=False).prefill(h))
    assert local_generate(qdir, PROMPT, 8) == local_generate(qdir, PROMPT, 8)


def test_quantize_weight_round_trip_error_is_bounded():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 96, generator=g)
    w[3] = 0  # an all-zero row gets scale 1, not a division by zero
    q, s = quantize_weight(w)
    assert q.dtype == torch.int8 and s.shape == (48,) and int(q.abs().max()) == 127
    back = q.float() * s[:, None]
    assert float((back - w).abs().max(dim=1).values.div(s).max()) <= 0.5 + 1e-5  # at most half a step per row
    assert torch.equal(back[3], torch.zeros(96))
    with pytest.raises(ValueError):
        quantize_weight(torch.tensor([[float("nan"), 1.0]]))


def test_three_int8_servers_equal_one_process_and_committee_votes_valid(tiny, tmp_path):
    qdir = tiny[2]

    async def main():
        with trio.fail_after(120):
            async with trio.open_nursery() as n:
                _, _, client = await make_swarm(n, qdir, tmp_path, SPANS)
                gen = await client.generate(PROMPT, 8)
                member = CommitteeMember(Identity.generate(), None, None, client.blobs, TorchExecutor(1),
                                         lambda s, e: SpanModel(qdir, s, e), load_manifest(qdir).model_id)
                verdicts = [await member.check(r) for r in gen.receipts]
                n.cancel_scope.cancel()
                return gen, verdicts

    gen, verdicts = trio.run(main)
    assert gen.tokens == local_generate(qdir, PROMPT, 8)
    assert len(set(gen.tokens)) > 2
    assert {r.model_id for r in gen.receipts} == {load_manifest(qdir).model_id}
    assert len(gen.receipts) == 3 and [v for v, _ in verdicts] == [VALID] * 3


def test_server_claiming_the_float_model_while_running_int8_is_voted_invalid(tiny, tmp_path):
    _, fdir, qdir = tiny
    float_id = load_manifest(fdir).model_id

    async def main():
        with trio.fail_after(120):
            async with trio.open_nursery() as n:
                net, servers, client = await make_swarm(n, fdir, tmp_path, SPANS)
                cheap = SpanModel(qdir, *SPANS[1])
                cheap.model_id = float_id  # the lie: announces and signs receipts for the float model
                liar = SpanServer(servers[1].ident, CHAIN, cheap, TorchExecutor(1), BlobStore(tmp_path / "liar"),
                                  lambda: 7, PRICE, submit=FakeLedger().submit)
                net.servers[liar.ident.peer_id] = liar  # replaces the honest server of blocks [2, 4)
                await announce(client.swarm, liar, seq=2)
                gen = await client.generate(PROMPT, 8)
                member = CommitteeMember(Identity.generate(), None, None, client.blobs, TorchExecutor(1),
                                         lambda s, e: SpanModel(fdir, s, e), float_id)
                verdicts = {r.span_start: await member.check(r) for r in gen.receipts}
                n.cancel_scope.cancel()
                return verdicts

    verdicts = trio.run(main)
    assert verdicts[0][0] == VALID and verdicts[4][0] == VALID
    assert verdicts[2][0] == INVALID and verdicts[2][1] > 10 * DEFAULT_TOLERANCE, verdicts[2]


def test_damaged_int8_files_are_refused(tiny, tmp_path):
    import shutil

    qdir = tiny[2]
    bad = tmp_path / "bad"
    shutil.copytree(qdir, bad)
    raw = bytearray((bad / block_file(1)).read_bytes())
    raw[-5] ^= 0xFF  # one weight byte of block 1
    (bad / block_file(1)).write_bytes(bytes(raw))
    SpanModel(bad, 0, 1)  # block 0 untouched
    with pytest.raises(ValueError, match="hash mismatch"):
        SpanModel(bad, 1, 2)
    # the manifest may not drop (or change) the quantization that config.json commits to
    m = json.loads((qdir / "manifest.json").read_text())
    for q in (None, "int4"):
        shutil.copyfile(qdir / "manifest.json", bad / "manifest.json")
        (bad / "manifest.json").write_text(json.dumps({**m, "quantization": q}))
        with pytest.raises(ManifestError, match="quantization"):
            load_manifest(bad)
    # an int8 weight without its scale
    from safetensors.torch import load_file

    sd = load_file(str(qdir / block_file(0)))
    del sd["mlp.up_proj.weight_scale"]
    with pytest.raises(ValueError, match="scale"):
        dequantize_block(sd)


def test_quantize_refusals_leave_the_cache_unchanged(tiny):
    cache = tiny[0]
    before = sorted(p.name for p in cache.iterdir())
    with pytest.raises(CheckpointError, match="already quantized"):
        add_model("tiny-int8", cache, name="again", quantize="int8")
    with pytest.raises(registry.RegistryError, match="neither a file"):
        add_model("no-such-model", cache, quantize="int8")
    with pytest.raises(registry.RegistryError, match="already added"):
        add_model("tiny", cache, quantize="int8")
    assert sorted(p.name for p in cache.iterdir()) == before


def test_models_view_lists_float_and_int8_with_their_coverage(tiny):
    """``/v1/models``' body (node.api.modelsapi.models_view) over a real SwarmTable and model cache, and the
    explorer's models page rendered from it."""
    from types import SimpleNamespace

    from node.api.modelsapi import ModelsOut, models_view
    from node.api.pages import environment
    from node.inference.swarm import SwarmTable

    cache, fdir, qdir = tiny
    fm, qm = load_manifest(fdir), load_manifest(qdir)
    swarm = SwarmTable()
    now = swarm.clock()
    for peer, mid, (a, b), seen in [("12D3KooWa", qm.model_id, (0, 4), now), ("12D3KooWb", qm.model_id, (2, 6), now),
                                    ("12D3KooWc", fm.model_id, (0, 3), now), ("12D3KooWd", fm.model_id, (3, 6), -1e9),
                                    ("12D3KooWe", b"\x07" * 32, (0, 9), now)]:
        swarm.entries[peer] = {"model_id": mid, "start": a, "end": b, "addrs": [], "seen": seen, "ttl": 60.0,
                               "active": 1, "seq": 1, "refreshes": 0}
    node = SimpleNamespace(cfg=SimpleNamespace(model_cache=cache, model_dir=fdir, span=None), manifest=fm,
                           swarm=swarm, server=None, ident=None)
    body = ModelsOut(**models_view(node)).model_dump()  # the route's response model accepts it
    by = {m["model_id"]: m for m in body["models"]}
    assert body["models"][0]["model_id"] == fm.model_id.hex()  # this node's model first
    f, q, other = by[fm.model_id.hex()], by[qm.model_id.hex()], by["07" * 32]
    assert (f["name"], f["quantization"], f["architecture"], f["this_node"]) == ("tiny-0", None, "Llama", True)
    assert (q["name"], q["quantization"], q["local"]) == ("tiny-int8", "int8", True)
    assert q["coverage"] == [1, 1, 2, 2, 1, 1] and q["covered"] == 6 and len(q["servers"]) == 2
    assert f["coverage"] == [1, 1, 1, 0, 0, 0] and f["covered"] == 3  # the stale server d is not counted
    assert other["name"] is None and not other["local"] and other["num_blocks"] == 9
    html = environment().get_template("models.html").render(chain_id="t", head=1, now_ms=0, models=body["models"])
    assert "tiny-int8" in html and "int8" in html and "3 / 6" in html and "announced only" in html


def test_the_int8_fault_computes_what_the_int8_copy_computes_under_the_float_id(tiny):
    """``node start --fault int8`` (the test switch behind the real-model devnet check): its span's forward is the
    int8 copy's output to within float rounding, far from the float model's, while it keeps the float model id and
    its committee path (prefill) stays the float model's."""
    _, fdir, qdir = tiny
    x = _hidden(fdir)
    liar = SpanModel(fdir, *SPANS[1], fault="int8")
    honest, copy8 = SpanModel(fdir, *SPANS[1]), SpanModel(qdir, *SPANS[1])
    assert liar.model_id == load_manifest(fdir).model_id != copy8.model_id
    y_liar, y8, y = (m.forward(x, m.new_cache()) for m in (liar, copy8, honest))
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    assert rel(y_liar, y8) < DEFAULT_TOLERANCE / 10 and rel(y_liar, y) > 10 * DEFAULT_TOLERANCE
    assert torch.equal(liar.prefill(x), honest.prefill(x))
