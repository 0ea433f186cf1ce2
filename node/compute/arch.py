"""The decoder architectures Tally serves, and how their pieces are built from a model dir's ``config.json``.

Every supported family is implemented in transformers as ``<X>Model`` (embedding, ``layers``, final norm,
``rotary_emb``) inside ``<X>ForCausalLM`` (plus ``lm_head``), with decoder layers that take
``(hidden, attention_mask, position_embeddings, position_ids, cache)``. Tally runs those classes unchanged: a span
is the base model with its embedding and final norm replaced by identities and only its slice of ``layers``
(``config.layer_types`` sliced alike, so sliding-window and global layers keep their kind per block index); the
client head is the embedding (with Gemma's × sqrt(hidden) scale), the final norm (Gemma's ``1 + weight`` RMSNorm)
and the LM head (with Gemma 2/3's final-logit soft-capping ``cap · tanh(logits / cap)``).

What each family needs beyond Llama, all inside transformers' own layer classes: Mistral — sliding-window
attention over every layer; Qwen2 — q/k/v biases; Qwen3 — q/k RMSNorm per head; Gemma2 — attention-logit
soft-capping, alternating sliding/global layers, pre/post-feedforward norms; Gemma3 (text) — q/k norms,
sliding/global layers with their own rope bases (``rope_parameters[layer_type]``). The spans
(:mod:`node.compute.span`), the client head (:mod:`node.compute.head`), the one-process reference model and
``node model add`` (:mod:`node.models.sources`) all build from here.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

# SUPPORTED: ``model_type`` -> human architecture name. Only these are accepted by ``node model add``; each one is
# tested end to end (spans, KV cache, LoRA training, committee replay) in ``tests/models``.
from .families import SUPPORTED

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class UnsupportedArchitecture(ValueError):
    """A config's ``model_type`` is not one Tally can split into spans."""


@dataclass(frozen=True)
class Arch:
    """Classes of one architecture: ``base_cls`` (``<X>Model``) and ``causal_cls`` (``<X>ForCausalLM``)."""

    model_type: str
    name: str
    base_cls: type
    causal_cls: type


def check_model_type(model_type: Any) -> str:
    """``model_type`` if supported.

    Raises:
        UnsupportedArchitecture: anything else, naming the supported types.
    """
    if model_type == "gemma3":
        raise UnsupportedArchitecture(
            "model_type 'gemma3' is the multimodal Gemma 3 checkpoint; only its text decoder ('gemma3_text', "
            "e.g. gemma-3-1b) is supported")
    if model_type not in SUPPORTED:
        raise UnsupportedArchitecture(
            f"unsupported architecture: model_type {model_type!r}; supported: {', '.join(sorted(SUPPORTED))}")
    assert isinstance(model_type, str)  # a key of SUPPORTED
    return model_type


def architecture(cfg: PretrainedConfig) -> Arch:
    """The :class:`Arch` of a transformers config (``cfg.model_type``).

    Raises:
        UnsupportedArchitecture: the type is not in :data:`SUPPORTED`.
    """
    # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    t = check_model_type(getattr(cfg, "model_type", None))
    base, causal = MODEL_MAPPING_NAMES[t], MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t]
    assert isinstance(base, str) and isinstance(causal, str)  # one class each for the SUPPORTED families
    return Arch(t, SUPPORTED[t], getattr(transformers, base), getattr(transformers, causal))


def materialize_buffers(model: torch.nn.Module, cfg: PretrainedConfig) -> None:
    """Give a model built on the ``meta`` device real non-persistent buffers after its weights were assigned:
    rotary embeddings are rebuilt from ``cfg`` and Gemma's ``embed_scale`` from its scalar.

    Raises:
        RuntimeError: a parameter or buffer is still on ``meta`` afterwards (an architecture this code does not
            know how to complete; never silently left uninitialised).
    """
    for name, mod in list(model.named_modules()):
        if name.endswith("rotary_emb"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], type(mod)(config=cfg))
        elif hasattr(mod, "scalar_embed_scale") and getattr(mod, "embed_scale", None) is not None:
            mod.embed_scale = torch.tensor(mod.scalar_embed_scale)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"{type(model).__name__}: tensors left uninitialised: {', '.join(left[:5])}")


def embed_scale(cfg: PretrainedConfig) -> float | None:
    """The factor the embedding output is multiplied by (Gemma: sqrt(hidden_size)), or None."""
    return math.sqrt(cfg.hidden_size) if cfg.model_type in ("gemma2", "gemma3_text") else None


def norm_class(cfg: PretrainedConfig) -> type:
    """The RMSNorm class of the architecture (Gemma's scales by ``1 + weight``)."""
    arch = architecture(cfg)
    mod = importlib.import_module(arch.base_cls.__module__)
    names = [n for n in dir(mod) if n.endswith("RMSNorm") and not n.startswith("_")]
    prefix = arch.base_cls.__name__.removesuffix("TextModel").removesuffix("Model")
    for n in names:
        if n == f"{prefix}RMSNorm":
            cls = getattr(mod, n)
            assert isinstance(cls, type)  # transformers' <X>RMSNorm class
            return cls
    raise UnsupportedArchitecture(f"no RMSNorm class found for {arch.model_type}")


def final_softcap(cfg: PretrainedConfig) -> float | None:
    """Final-logit soft-capping value (Gemma 2/3: ``logits = cap · tanh(logits / cap)``), or None."""
    cap = getattr(cfg, "final_logit_softcapping", None)
    return float(cap) if cap else None
