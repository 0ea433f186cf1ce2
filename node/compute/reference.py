"""Single-process reference run of a model dir, to compare a distributed route against.

It deliberately does not reuse :class:`SpanModel` / :class:`ClientHead`: it rebuilds one ordinary
``<X>ForCausalLM`` (:mod:`node.compute.arch`) from ``config.json``, ``head.safetensors`` and every
``block_NNN.safetensors`` (each checked
against the manifest) and decodes greedily with transformers' own forward and ``DynamicCache``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from node.compute.arch import architecture, materialize_buffers
from node.compute.int8 import dequantize_block

from .model import block_file, load_checked, load_head, load_manifest, load_span_config


# Any: the <X>ForCausalLM of the config's architecture. Its callers use it as a torch Module (the batch runner), a peft
# base and a transformers model (node.training: ``config.save_pretrained``); transformers' PreTrainedModel types
# ``.to(device)`` wrongly (a decorator's wrapper), and torch's Module types every attribute as Tensor | Module
def load_causal_lm(model_dir: Path) -> Any:
    """The full model of ``model_dir`` as one float32 CPU ``<X>ForCausalLM`` (its architecture's class) in eval mode.

    Raises:
        FileNotFoundError: a file is missing.  ValueError: a file does not match the manifest.
        node.compute.arch.UnsupportedArchitecture: config.json names an architecture Tally does not run.
    """
    model_dir = Path(model_dir)
    manifest = load_manifest(model_dir)
    cfg = load_span_config(model_dir)
    head = load_head(model_dir, manifest, bool(getattr(cfg, "tie_word_embeddings", False)))
    cfg.tie_word_embeddings = False  # lm_head is its own tensor here (equal to the embedding when tied)
    sd = {
        "model.embed_tokens.weight": head["embed_tokens.weight"],
        "model.norm.weight": head["norm.weight"],
        "lm_head.weight": head["lm_head.weight"],
    }
    for i in range(manifest.num_blocks):
        block = load_checked(model_dir, block_file(i), manifest.block_hashes[i], f"block {i}")
        if manifest.quantization is not None:  # int8: the float weights it computes with, bit for bit
            block = dequantize_block(block, f"block {i}")
        sd.update({f"model.layers.{i}.{k}": v for k, v in block.items()})
    with torch.device("meta"):
        model = architecture(cfg).causal_cls(cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    materialize_buffers(model, cfg)  # rotary and embedding-scale buffers: real instead of meta
    return model.eval().requires_grad_(False)


def local_generate(model_dir: Path, prompt_ids: list[int], max_new_tokens: int,
                   model: torch.nn.Module | None = None) -> list[int]:
    """Greedy decoding of ``max_new_tokens`` tokens after ``prompt_ids`` in this process; returns only new ids.

    No early stop at EOS: exactly ``max_new_tokens`` ids come back (a distributed route is compared step by
    step). One prefill of the prompt, then one forward per new token with a ``DynamicCache``. Pass ``model`` (from
    :func:`load_causal_lm`) to skip reloading.

    Raises:
        ValueError: empty prompt, id outside the vocabulary, negative ``max_new_tokens``, or more positions than
            the model's ``max_length``; as :func:`load_causal_lm`.
    """
    # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
    from transformers import DynamicCache

    manifest = load_manifest(Path(model_dir))
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("prompt_ids must not be empty")
    if any(not 0 <= t < manifest.vocab_size for t in ids):
        raise ValueError(f"prompt id outside [0, {manifest.vocab_size})")
    if max_new_tokens < 0 or len(ids) + max_new_tokens > manifest.max_length:
        raise ValueError(f"{len(ids)} + {max_new_tokens} positions do not fit max_length {manifest.max_length}")
    if model is None:
        model = load_causal_lm(model_dir)
    # nn.Module types every attribute as Tensor | Module; a <X>ForCausalLM's config is its PretrainedConfig
    cache = DynamicCache(config=model.config)  # type: ignore[arg-type]
    out: list[int] = []
    step = torch.tensor([ids], dtype=torch.long)
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(input_ids=step, cache=cache, use_cache=True).logits
            nxt = int(logits[0, -1].float().argmax())
            out.append(nxt)
            step = torch.tensor([[nxt]], dtype=torch.long)
    return out
