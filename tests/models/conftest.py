"""Tiny random checkpoints of every supported architecture, written with ``save_pretrained`` (safetensors) and a
byte-level BPE tokenizer trained offline on docs/DESIGN.md, once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md"
SLIDING = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, max_position_embeddings=128, initializer_range=0.3)
# per architecture: config class name and what makes it differ from Llama (window 4 < the 13 positions decoded,
# so sliding-window layers really drop keys; soft-capping on; tied and untied embeddings both covered -- Gemma
# untied: its x sqrt(hidden) embedding dominates a random model's residual stream, so a tied random Gemma just
# echoes its input token and the test could not tell positions apart)
ARCHS = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "mistral": ("MistralConfig", dict(sliding_window=4, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=True)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=4, layer_types=SLIDING, query_pre_attn_scalar=16,
                                    final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                                    tie_word_embeddings=False)),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=4, layer_types=SLIDING,
                                             query_pre_attn_scalar=16, final_logit_softcapping=30.0,
                                             tie_word_embeddings=False)),
}


def build_tokenizer(out: Path):
    """A byte-level BPE tokenizer (~300 tokens) trained offline on DESIGN.md, saved as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([DESIGN.read_text()], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(str(out))
    return fast


def write_checkpoint(out: Path, model_type: str, seed: int = 0, tokenizer: bool = True) -> Path:
    """``save_pretrained`` of a tiny random ``model_type`` model (and tokenizer) into ``out``; returns ``out``."""
    import transformers

    cls_name, extra = ARCHS[model_type]
    out.mkdir(parents=True, exist_ok=True)
    vocab = len(build_tokenizer(out)) if tokenizer else 300
    if not tokenizer:
        for f in out.iterdir():
            f.unlink()
    cfg = getattr(transformers, cls_name)(**COMMON, **extra, vocab_size=vocab, eos_token_id=0, bos_token_id=None,
                                          pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """``{model_type: checkpoint dir}`` for every architecture in :data:`ARCHS`."""
    root = tmp_path_factory.mktemp("hf")
    return {t: write_checkpoint(root / t, t, seed=i) for i, t in enumerate(ARCHS)}


@pytest.fixture(scope="session")
def added(checkpoints, tmp_path_factory):
    """``(cache dir, {model_type: Tally model dir})``: every checkpoint added with ``node model add``."""
    from node.models.convert import add_model

    cache = tmp_path_factory.mktemp("cache")
    dirs = {}
    for t, src in checkpoints.items():
        e = add_model(src, cache, name=f"tiny-{t.replace('_', '-')}")
        dirs[t] = cache / e.dir
    return cache, dirs
