"""A synthetic Llama GGUF of any size: random quantized blocks, a byte-level tokenizer (issue 36's tests and bench).

Quantized tensors are random bytes with their scale fields set to small finite half floats, so every value
dequantizes to a finite float; writing costs about the file's size in random bytes, not a quantizer's time.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# a minimal chat template (Jinja2, as in a tokenizer's tokenizer.chat_template)
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# byte offsets of the float16 scale fields inside one block of each type (ggml-common.h's block_q*)
_SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,)}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-to-character table (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def random_quant(rng: np.random.Generator, rows: int, cols: int, type_name: str) -> np.ndarray:
    """``uint8 (rows, bytes_per_row)``: random blocks of ``type_name`` whose scales are finite and small."""
    qtype = GGMLQuantizationType[type_name]
    block, size = GGML_QUANT_SIZES[qtype]
    assert cols % block == 0, (cols, block)
    nblocks = rows * cols // block
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in _SCALES[type_name]:
        scale = rng.uniform(0.001, 0.02, size=nblocks).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(rows, cols // block * size)


def write_llama_gguf(path: Path, *, blocks: int, hidden: int, ffn: int, heads: int, kv_heads: int,
                     vocab: int = 320, type_name: str = "Q8_0", tied: bool = True, seed: int = 0) -> Path:
    """Write a random Llama-architecture GGUF to ``path`` and return it.

    Block weights are ``type_name`` (one of Q8_0, Q4_0, Q4_1, Q4_K, Q6_K), norms F32, the embedding Q8_0 and, when
    not ``tied``, an F16 LM head. ``vocab`` ≥ 260: three specials, 256 byte tokens and one merge.
    """
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("synthetic-llama")
    w.add_block_count(blocks)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens = ["<unk>", "<s>", "</s>", *_bytes_to_unicode(), "Ġt"]
    tokens += [f"<extra_{i}>" for i in range(vocab - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)

    # (name, rows, cols, type): cols 0 for a 1-D F32 norm. Tensor infos first, then each tensor's bytes made
    # and written one at a time, so a file of gigabytes never sits in memory.
    specs: list[tuple[str, int, int, str]] = [("token_embd.weight", vocab, hidden, "Q8_0")]
    kv = kv_heads * (hidden // heads)
    for i in range(blocks):
        b = f"blk.{i}"
        specs += [(f"{b}.attn_norm.weight", hidden, 0, "F32"), (f"{b}.attn_q.weight", hidden, hidden, type_name),
                  (f"{b}.attn_k.weight", kv, hidden, type_name), (f"{b}.attn_v.weight", kv, hidden, type_name),
                  (f"{b}.attn_output.weight", hidden, hidden, type_name), (f"{b}.ffn_norm.weight", hidden, 0, "F32"),
                  (f"{b}.ffn_gate.weight", ffn, hidden, type_name), (f"{b}.ffn_up.weight", ffn, hidden, type_name),
                  (f"{b}.ffn_down.weight", hidden, ffn, type_name)]
    specs.append(("output_norm.weight", hidden, 0, "F32"))
    if not tied:
        specs.append(("output.weight", vocab, hidden, "F16"))

    def make(rows: int, cols: int, t: str) -> np.ndarray:
        if t == "F32":
            return rng.uniform(0.5, 1.5, size=rows).astype(np.float32)
        if t == "F16":
            return rng.normal(0, 0.02, size=(rows, cols)).astype(np.float16)
        return random_quant(rng, rows, cols, t)

    for name, rows, cols, t in specs:
        if t == "F32":
            w.add_tensor_info(name, (rows,), np.dtype(np.float32), rows * 4)
        elif t == "F16":
            w.add_tensor_info(name, (rows, cols), np.dtype(np.float16), rows * cols * 2)
        else:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t]]
            w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), rows * cols // block * size,
                              raw_dtype=GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, rows, cols, t in specs:
        w.write_tensor_data(make(rows, cols, t))
    w.close()
    return path
