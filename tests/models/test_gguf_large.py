"""Issue 36, check 1: a synthetic Llama GGUF whose float32 model is over 6 GiB (25 blocks, random Q4_K weights)
is added by ``node model add`` in a process whose peak RSS, above the same command's on a tiny GGUF (the
interpreter, torch and transformers), stays within twice one block's float32 size plus the head; the cache takes
at most 1.3× the GGUF on disk; and a block loaded from the cache equals transformers' GGUF dequantization of the
same tensors (gguf-py's ``dequantize`` and transformers' Llama fix-up, tensor by tensor) bit for bit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader, dequantize
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from node.compute.model import block_file, load_checked, load_manifest

from .synth_gguf import write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]
BIG = {"blocks": 25, "hidden": 2048, "ffn": 8192, "heads": 16, "kv_heads": 16, "vocab": 320}
GiB = 1 << 30

PEAK = """
import resource, sys
from node.models.cli import main
rc = main(["model", "add", sys.argv[1], "--model-cache", sys.argv[2]])
print("peak-rss-kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
sys.exit(rc)
"""


def _add(src: Path, cache: Path) -> int:
    """``node model add src`` in a fresh process; its peak RSS in bytes."""
    r = subprocess.run([sys.executable, "-c", PEAK, str(src), str(cache)], capture_output=True, text=True,
                       cwd=ROOT, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return int(re.search(r"peak-rss-kib (\d+)", r.stdout).group(1)) * 1024


@pytest.mark.slow  # writes and converts a 0.94 GB GGUF: about a minute on 2 cores
def test_a_6_gib_model_converts_within_two_blocks_of_memory_and_its_gguf_size_on_disk(tmp_path):
    h, f, kv = BIG["hidden"], BIG["ffn"], BIG["kv_heads"] * BIG["hidden"] // BIG["heads"]
    block_params = 2 * h * h + 2 * kv * h + 3 * h * f + 2 * h
    head_params = 2 * BIG["vocab"] * h + h  # embedding and (tied) LM head, final norm
    float32_bytes = 4 * (BIG["blocks"] * block_params + head_params)
    assert float32_bytes >= 6 * GiB, float32_bytes / GiB

    small = write_llama_gguf(tmp_path / "small.gguf", blocks=2, hidden=256, ffn=512, heads=4, kv_heads=4,
                             type_name="Q4_K")
    big = write_llama_gguf(tmp_path / "big.gguf", **BIG, type_name="Q4_K")
    base = _add(small, tmp_path / "cache-small")
    peak = _add(big, tmp_path / "cache-big")
    bound = 2 * 4 * block_params + 4 * head_params
    print(f"\nfloat32 model {float32_bytes / GiB:.2f} GiB, GGUF {big.stat().st_size / GiB:.2f} GiB; converter peak "
          f"RSS {peak / 2**20:.0f} MiB, {base / 2**20:.0f} MiB on a tiny GGUF: +{(peak - base) / 2**20:.0f} MiB "
          f"(bound {bound / 2**20:.0f} MiB: two float32 blocks + the head)")
    assert peak - base <= bound

    (d,) = [p for p in (tmp_path / "cache-big").iterdir() if p.is_dir()]
    disk = sum(p.stat().st_size for p in d.iterdir())
    assert disk <= 1.3 * big.stat().st_size, (disk, big.stat().st_size)

    last = BIG["blocks"] - 1
    m = load_manifest(d)
    ours = load_checked(d, block_file(last), m.block_hashes[last], f"block {last}")
    processor = LlamaTensorProcessor(config={"num_attention_heads": BIG["heads"],
                                             "num_key_value_heads": BIG["kv_heads"]})
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    seen = 0
    for t in GGUFReader(str(big)).tensors:
        if not t.name.startswith(f"blk.{last}."):
            continue
        theirs = processor.process(weights=dequantize(t.data, t.tensor_type), name=t.name).weights
        key = names[t.name.split(".")[2]] + ".weight"
        assert torch.equal(ours[key], torch.from_numpy(np.copy(theirs))), key
        seen += 1
    assert seen == len(names) == len(ours)
