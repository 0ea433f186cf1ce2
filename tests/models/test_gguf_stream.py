"""Issue 36: a GGUF file converted tensor by tensor, blocks kept in their GGUF types and dequantized at load.

Synthetic Llama GGUFs (random quantized blocks, tests/models/synth_gguf.py): what a span or a one-process model
loads equals transformers' own GGUF loader (the whole file dequantized at once) bit for bit; the cache takes about
the GGUF's size on disk; ``--blocks`` writes one span with the whole model's id; a stored tensor whose GGUF type
is relabelled, or whose bytes are malformed, is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from node.compute.ggufq import QuantizedTensorError, dequantize_stored
from node.compute.model import block_file, load_checked, load_manifest
from node.compute.reference import load_causal_lm, local_generate
from node.compute.span import SpanModel
from node.models.convert import add_model
from node.models.ggufstream import Storage
from node.models.lookup import model_dir_of
from node.models.sources import CheckpointError

from .synth_gguf import write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]
SHAPE = {"blocks": 3, "hidden": 256, "ffn": 512, "heads": 4, "kv_heads": 2}  # k-quants: rows of 256


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    return {"q4k-untied": write_llama_gguf(d / "q4k.gguf", **SHAPE, type_name="Q4_K", tied=False, seed=1),
            "q8-tied": write_llama_gguf(d / "q8.gguf", **SHAPE, type_name="Q8_0", tied=True, seed=2),
            "q6k-tied": write_llama_gguf(d / "q6k.gguf", **SHAPE, type_name="Q6_K", tied=True, seed=3)}


def _transformers(path: Path) -> dict[str, torch.Tensor]:
    m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return m.state_dict()


@pytest.mark.parametrize("kind", ["q4k-untied", "q8-tied", "q6k-tied"])
def test_loaded_weights_equal_transformers_gguf_loader_bit_for_bit_at_about_the_gguf_size(ggufs, kind, tmp_path):
    src = ggufs[kind]
    entry = add_model(src, tmp_path / "cache")
    d = model_dir_of(entry.name, tmp_path / "cache")
    ours, theirs = load_causal_lm(d).state_dict(), _transformers(src)
    assert set(ours) == set(theirs)
    unequal = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert not unequal, unequal
    # the q/k projections really were reordered (a no-op fix-up would pass the equality only by accident)
    stored = load_file(str(d / block_file(0)))
    q_raw = next(v for k, v in stored.items() if k.startswith("self_attn.q_proj.weight.gguf_"))
    assert q_raw.dtype == torch.uint8
    disk = sum(p.stat().st_size for p in d.iterdir() if p.suffix == ".safetensors")
    assert disk <= 1.3 * src.stat().st_size, (disk, src.stat().st_size)
    # and a span serves the stored blocks: its output equals the one-process model's block outputs
    span = SpanModel(d, 1, 3)
    model = load_causal_lm(d)
    x = torch.randn(1, 5, SHAPE["hidden"])
    pos = torch.arange(5)[None]
    h = x
    for layer in model.model.layers[1:3]:
        h = layer(h, position_embeddings=model.model.rotary_emb(h, pos), position_ids=pos)
        h = h[0] if isinstance(h, tuple) else h
    assert torch.allclose(span.prefill(x), h, atol=1e-5)


def test_float32_storage_gives_the_same_weights_at_four_bytes_a_parameter(ggufs, tmp_path):
    src = ggufs["q4k-untied"]
    g = model_dir_of(add_model(src, tmp_path / "a").name, tmp_path / "a")
    f = model_dir_of(add_model(src, tmp_path / "b", storage=Storage.FLOAT32).name, tmp_path / "b")
    sd_g, sd_f = load_causal_lm(g).state_dict(), load_causal_lm(f).state_dict()
    assert all(torch.equal(sd_g[k], sd_f[k]) for k in sd_g)
    assert all(v.dtype == torch.float32 for v in load_file(str(f / block_file(0))).values())
    assert load_manifest(g).model_id != load_manifest(f).model_id  # stored bytes differ: two models


def test_blocks_writes_one_span_under_the_whole_models_id_and_it_generates(ggufs, tmp_path):
    src = ggufs["q8-tied"]
    whole = model_dir_of(add_model(src, tmp_path / "whole").name, tmp_path / "whole")
    part = model_dir_of(add_model(src, tmp_path / "part", span=range(1, 2)).name, tmp_path / "part")
    assert load_manifest(part) == load_manifest(whole)
    assert sorted(p.name for p in part.glob("block_*")) == [block_file(1)]
    span = SpanModel(part, 1, 2)  # the span loads from the partial dir
    assert span.model_id == load_manifest(whole).model_id
    with pytest.raises(FileNotFoundError):
        SpanModel(part, 0, 1)
    assert len(local_generate(whole, [5, 6, 7], 4)) == 4
    with pytest.raises(CheckpointError, match="outside the model's 3 blocks"):
        add_model(src, tmp_path / "bad", span=range(2, 9))
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").glob("*/manifest.json"))


def test_a_relabelled_gguf_type_no_longer_matches_the_manifest(ggufs, tmp_path):
    d = model_dir_of(add_model(ggufs["q8-tied"], tmp_path / "c").name, tmp_path / "c")
    m = load_manifest(d)
    sd = load_file(str(d / block_file(0)))
    relabelled = {k.replace(".gguf_Q8_0", ".gguf_Q4_0") if "v_proj" in k else k: v for k, v in sd.items()}
    assert relabelled != sd.keys()
    save_file(relabelled, str(d / block_file(0)))
    with pytest.raises(ValueError, match="hash mismatch"):
        load_checked(d, block_file(0), m.block_hashes[0], "block 0")


def test_malformed_stored_bytes_are_refused_before_dequantization():
    with pytest.raises(QuantizedTensorError, match="uint8 of rank"):
        dequantize_stored({"w.gguf_Q8_0": torch.zeros(4, 34, dtype=torch.int8)})
    with pytest.raises(QuantizedTensorError, match="whole blocks"):
        dequantize_stored({"w.gguf_Q8_0": torch.zeros(4, 33, dtype=torch.uint8)})
    with pytest.raises(QuantizedTensorError, match="not one Tally stores"):
        dequantize_stored({"w.gguf_IQ2_XXS": torch.zeros(4, 66, dtype=torch.uint8)})
    with pytest.raises(QuantizedTensorError, match="stored twice"):
        dequantize_stored({"w": torch.zeros(4, 32), "w.gguf_Q8_0": torch.zeros(4, 34, dtype=torch.uint8)})
    assert dequantize_stored({"w.gguf_Q8_0": torch.zeros(4, 34, dtype=torch.uint8)})["w"].shape == (4, 32)


def test_the_cli_converts_a_span_and_explains_a_bad_one(ggufs, tmp_path):
    cmd = [sys.executable, "-m", "node.cli", "model", "add", str(ggufs["q6k-tied"]), "--model-cache",
           str(tmp_path / "cache"), "--blocks", "0:2", "--name", "half"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "blocks 0:2, stored as native" in r.stdout and "added half" in r.stdout, r.stdout
    entry = json.loads((tmp_path / "cache" / "registry.json").read_text())
    assert entry  # registered
    bad = subprocess.run(cmd[:-4] + ["--blocks", "2:1"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "expected A:B with 0 <= A < B" in bad.stderr
