"""A server's shard: the contiguous decoder blocks ``[start, end)`` of a model dir (see :mod:`node.compute.model`).

Hidden states travel as float32 tensors of shape ``(batch, tokens, hidden)``. Incremental decoding keeps a
``transformers.DynamicCache`` per inference session; positions come from the cache length, so a span fed the
same inputs (in one call or step by step) computes the same outputs as the corresponding blocks of the full
model. All torch work here is blocking: call it through :class:`node.compute.executor.TorchExecutor`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from node.compute.arch import architecture, materialize_buffers
from node.compute.int8 import load_block
from node.encoding import pack

from .cheats import FAULTS, apply_output_fault, cheat_net
from .model import block_file, load_checked, load_manifest, load_span_config

if TYPE_CHECKING:
    from transformers import DynamicCache


class SpanModel:
    """Decoder blocks ``[start, end)`` of the model in ``model_dir``, ready for inference.

    Attributes: ``start``, ``end``, ``model_id`` (32 bytes), ``hidden_size``, ``max_length`` (tokens a session may
    hold), ``manifest``, ``device``, ``fault``, ``arch`` (:class:`node.compute.arch.Arch`), ``batchable`` (False
    when a block attends through a sliding window: its steps are not batched across sessions).

    ``fault`` makes a cheating server for devnet/tests (see :mod:`node.compute.cheats`): it changes
    :meth:`forward`, never :meth:`prefill`.

    An int8 model (``manifest.quantization``) keeps its int8 weights resident (``int8_resident``, the default;
    False dequantizes them to float32 at load, for measurement) -- see :mod:`node.compute.int8`.

    Raises (constructor):
        FileNotFoundError: model dir, manifest or a block file is missing.
        ValueError: bad span bounds, unknown fault, or a block file whose hash differs from the manifest
            (``ManifestError`` for an inconsistent manifest).
    """

    def __init__(self, model_dir: Path, start: int, end: int, device: str = "cpu", fault: str | None = None,
                 int8_resident: bool = True):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {FAULTS}")
        self.model_dir = Path(model_dir)
        self.manifest = load_manifest(self.model_dir)
        L = self.manifest.num_blocks
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= L):
            raise ValueError(f"span [{start}, {end}) is not a non-empty range inside [0, {L})")
        self.start, self.end = start, end
        self.model_id = self.manifest.model_id
        self.hidden_size = self.manifest.hidden_size
        self.max_length = self.manifest.max_length
        self.device = torch.device(device)
        self.fault = fault

        cfg = load_span_config(self.model_dir)
        cfg.num_hidden_layers = end - start
        cfg.vocab_size = 1  # the client holds the embedding; don't allocate it
        cfg.pad_token_id = None
        if getattr(cfg, "layer_types", None) is not None:
            cfg.layer_types = list(cfg.layer_types[start:end])
        self.config = cfg

        self.arch = architecture(cfg)  # Llama, Mistral, Qwen2/3, Gemma2/3: see node.compute.arch
        with torch.device("meta"):  # no allocation or random init; real weights are assigned below
            net = self.arch.base_cls(cfg)
        net.embed_tokens = torch.nn.Identity()
        net.norm = torch.nn.Identity()
        for i in range(end - start):
            idx = start + i
            sd = load_checked(self.model_dir, block_file(idx), self.manifest.block_hashes[idx], f"block {idx}")
            # int8 model: int8 weights stay resident, dequantized per matmul (node.compute.int8)
            load_block(net.layers[i], sd, self.manifest.quantization, f"block {idx}", resident=int8_resident)
        materialize_buffers(net, cfg)  # rotary buffers must be real, not meta
        # server-side batching pads every layer's cache to one length; a sliding-window layer keeps only its
        # window, so spans with such layers run their steps one session at a time
        layer_types = getattr(cfg, "layer_types", None)
        if layer_types:
            self.batchable = all(t == "full_attention" for t in layer_types)
        else:  # Mistral: one sliding_window for every layer, or None
            self.batchable = getattr(cfg, "sliding_window", None) is None
        self.net = net.to(self.device).eval().requires_grad_(False)
        self._seed = pack([self.model_id, start, end])
        self._cheat_net = cheat_net(self.net, fault, self._seed) if fault else None
        self._replay: dict[int, torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"SpanModel({self.manifest.name}, [{self.start}, {self.end}), fault={self.fault})"

    def new_cache(self) -> DynamicCache:
        """A fresh, empty ``transformers.DynamicCache`` for one inference session on this span."""
        # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def _check(self, hidden: torch.Tensor, past: int) -> None:
        if not isinstance(hidden, torch.Tensor):
            raise TypeError("hidden must be a torch.Tensor")
        if hidden.dim() != 3 or hidden.shape[-1] != self.hidden_size or hidden.shape[0] < 1 or hidden.shape[1] < 1:
            raise ValueError(f"hidden must have shape (batch, tokens, {self.hidden_size}), got {tuple(hidden.shape)}")
        if hidden.dtype != torch.float32:
            raise ValueError(f"hidden must be float32, got {hidden.dtype}")
        if past + hidden.shape[1] > self.max_length:
            raise ValueError(f"{past} cached + {hidden.shape[1]} new tokens exceed max_length {self.max_length}")

    def _run(self, hidden: torch.Tensor, cache: DynamicCache, net: torch.nn.Module | None = None) -> torch.Tensor:
        past = cache.get_seq_length()
        self._check(hidden, past)
        # a span's layers are attention layers (DynamicLayer, DynamicSlidingWindowLayer): they have ``keys``
        first = cache.layers[0] if cache.layers else None
        if (past and first is not None and first.keys is not None  # type: ignore[union-attr]  # see above
                and first.keys.shape[0] != hidden.shape[0]):  # type: ignore[union-attr]  # see above
            raise ValueError("batch size differs from the one this cache was started with")
        net = self.net if net is None else net
        dtype = next(p for p in net.parameters() if p.is_floating_point()).dtype
        with torch.inference_mode():
            out: torch.Tensor = net(inputs_embeds=hidden.to(self.device, dtype), cache=cache,
                                    use_cache=True).last_hidden_state
        # clone outside inference mode: callers get an ordinary tensor they may modify in place
        return out.to(device="cpu", dtype=torch.float32).clone(memory_format=torch.contiguous_format)

    def forward(self, hidden: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Run new positions through the span, appending their keys/values to ``cache``.

        Args:
            hidden: float32 ``(batch, tokens, hidden_size)``; the next ``tokens`` positions of the session.
            cache: from :meth:`new_cache`, holding the session's previous positions (mutated in place).

        Returns:
            float32 CPU tensor ``(batch, tokens, hidden_size)``: the hidden states after block ``end - 1``.

        Raises:
            TypeError / ValueError: wrong type, shape, dtype, batch size, or the session would exceed
            ``max_length`` (the cache is left unchanged in that case).
        """
        past = cache.get_seq_length()
        if self.fault == "skip-block" and self._cheat_net is None:  # a one-block span: skip it entirely
            self._check(hidden, past)
            return hidden.clone()
        out = self._run(hidden, cache, self._cheat_net)
        return apply_output_fault(self.fault, hidden, out, past, self._seed, self._replay) if self.fault else out

    def prefill(self, hidden: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of all positions at once with a fresh cache, never faulty (used for re-execution).

        ``hidden`` is float32 ``(batch, tokens, hidden_size)``; returns the same shape. Raises as :meth:`forward`.
        """
        return self._run(hidden, self.new_cache())

    __call__ = forward
