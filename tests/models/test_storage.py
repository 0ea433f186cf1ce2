"""Issue 36: blocks kept small -- a checkpoint's 16-bit tensors stay 16-bit, and ``--storage bf16`` halves float32.

A bfloat16 checkpoint (as most releases are) added with the default ``native`` storage takes about its own size on
disk and loads back exactly what transformers loads from it cast to float32; ``--storage bf16`` rounds a float32
checkpoint or a GGUF file's dequantized tensors to bfloat16 (2 bytes a parameter) and loads back exactly those
rounded values; the stored bytes, hence the model id, commit to the storage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from node.compute.ggufq import QuantizedTensorError, pack_float
from node.compute.model import block_file, load_manifest
from node.compute.reference import load_causal_lm
from node.models.convert import add_model
from node.models.ggufstream import Storage
from node.models.lookup import model_dir_of

from .conftest import write_checkpoint
from .synth_gguf import write_llama_gguf


def _disk(d: Path) -> int:
    return sum(p.stat().st_size for p in d.glob("*.safetensors"))


def _bf16_checkpoint(tmp_path: Path) -> Path:
    src = write_checkpoint(tmp_path / "f32", "llama", seed=7)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
    out = tmp_path / "bf16"
    model.save_pretrained(str(out))
    for f in src.iterdir():
        if "token" in f.name:
            (out / f.name).write_bytes(f.read_bytes())
    return out


def test_a_bf16_checkpoint_is_kept_in_bf16_and_loads_as_transformers_casts_it(tmp_path):
    src = _bf16_checkpoint(tmp_path)
    d = model_dir_of(add_model(src, tmp_path / "cache").name, tmp_path / "cache")
    stored = load_file(str(d / block_file(0)))
    assert any(k.endswith(".gguf_BF16") for k in stored), sorted(stored)
    ours = load_causal_lm(d).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16).float().state_dict()
    unequal = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert not unequal, unequal
    f32 = model_dir_of(add_model(src, tmp_path / "f", storage=Storage.FLOAT32).name, tmp_path / "f")
    assert _disk(d) < 0.6 * _disk(f32), (_disk(d), _disk(f32))  # 2 bytes a parameter, not 4


def test_bf16_storage_rounds_a_float32_checkpoint_and_a_gguf_to_bfloat16(tmp_path):
    src = write_checkpoint(tmp_path / "ckpt", "llama", seed=8)
    native = model_dir_of(add_model(src, tmp_path / "n").name, tmp_path / "n")
    half = model_dir_of(add_model(src, tmp_path / "h", storage=Storage.BF16).name, tmp_path / "h")
    assert _disk(half) < 0.6 * _disk(native)
    assert load_manifest(half).model_id != load_manifest(native).model_id
    a, b = load_causal_lm(native).state_dict(), load_causal_lm(half).state_dict()
    for k in a:
        want = a[k].to(torch.bfloat16).float() if a[k].dim() >= 2 else a[k]
        assert torch.equal(b[k], want), k
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the rounding happened

    gguf = write_llama_gguf(tmp_path / "q8.gguf", blocks=2, hidden=256, ffn=512, heads=4, kv_heads=2,
                            type_name="Q8_0", tied=True, seed=4)
    g = load_causal_lm(model_dir_of(add_model(gguf, tmp_path / "g").name, tmp_path / "g")).state_dict()
    gb_dir = model_dir_of(add_model(gguf, tmp_path / "gb", storage=Storage.BF16).name, tmp_path / "gb")
    gb = load_causal_lm(gb_dir).state_dict()
    for k in g:
        want = g[k].to(torch.bfloat16).float() if g[k].dim() >= 2 else g[k]
        assert torch.equal(gb[k], want), k
    assert all(k.endswith(".gguf_BF16") or v.dim() == 1
               for k, v in load_file(str(gb_dir / block_file(0))).items())


def test_pack_float_refuses_what_it_cannot_keep():
    with pytest.raises(QuantizedTensorError, match="16-bit float type"):
        pack_float("w", torch.ones(2, 2), "Q8_0")
    with pytest.raises(QuantizedTensorError, match="rank >= 2"):
        pack_float("w", torch.ones(4), "BF16")
