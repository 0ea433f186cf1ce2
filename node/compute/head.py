"""The client's part of the model: token embedding, final RMSNorm and LM head (``head.safetensors``).

Per architecture (:mod:`node.compute.arch`): Gemma multiplies the embedding by sqrt(hidden_size) and its RMSNorm
scales by ``1 + weight``; Gemma 2/3 soft-cap the final logits (``cap · tanh(logits / cap)``), as transformers'
``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` do.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from node.compute.arch import embed_scale, final_softcap, norm_class

from .model import load_head, load_manifest, load_span_config

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class ClientHead:
    """Embedding, final norm and LM head of the model in ``model_dir`` (float32, CPU by default).

    Attributes: ``model_id``, ``hidden_size``, ``vocab_size``, ``max_length``, ``manifest``, ``tokenizer``
    (an ``AutoTokenizer`` loaded lazily from the dir, or ``None`` when the dir has no tokenizer files).

    Raises (constructor):
        FileNotFoundError: missing manifest/config/head file.
        ValueError: ``head.safetensors`` does not match the manifest's ``head_hash`` or lacks a tensor.
    """

    def __init__(self, model_dir: Path, device: str = "cpu"):
        self.model_dir = Path(model_dir)
        self.manifest = load_manifest(self.model_dir)
        self.model_id = self.manifest.model_id
        self.hidden_size = self.manifest.hidden_size
        self.vocab_size = self.manifest.vocab_size
        self.max_length = self.manifest.max_length
        self.device = torch.device(device)
        cfg = load_span_config(self.model_dir)
        sd = load_head(self.model_dir, self.manifest, bool(getattr(cfg, "tie_word_embeddings", False)))
        embed, norm_w, lm_head = sd["embed_tokens.weight"], sd["norm.weight"], sd["lm_head.weight"]
        V, D = self.vocab_size, self.hidden_size
        if embed.shape != (V, D) or lm_head.shape != (V, D) or norm_w.shape != (D,):
            raise ValueError("head tensor shapes do not match the manifest")
        self.embed_weight = embed.to(self.device)
        self.lm_head_weight = lm_head.to(self.device)
        self.norm = norm_class(cfg)(D, eps=cfg.rms_norm_eps)
        self.norm.weight = torch.nn.Parameter(norm_w, requires_grad=False)
        self.norm.to(self.device).eval()
        scale = embed_scale(cfg)
        self._embed_scale = None if scale is None else torch.tensor(scale, dtype=torch.float32, device=self.device)
        self._softcap = final_softcap(cfg)
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._tokenizer_loaded = False

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The model's tokenizer, or ``None`` when the model dir ships no tokenizer files (tiny test models)."""
        if not self._tokenizer_loaded:
            if any((self.model_dir / f).is_file() for f in _TOKENIZER_FILES):
                # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), trust_remote_code=False)
            self._tokenizer_loaded = True
        return self._tokenizer

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``LongTensor (batch, tokens)`` -> float32 CPU hidden states ``(batch, tokens, hidden)``.

        Raises:
            ValueError: not a 2-D integer tensor, empty, or an id outside ``[0, vocab_size)``.
        """
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError("ids must be an integer tensor of shape (batch, tokens)")
        if ids.numel() == 0:
            raise ValueError("ids must not be empty")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"token id outside [0, {self.vocab_size})")
        with torch.inference_mode():
            out = torch.nn.functional.embedding(ids.to(self.device, torch.int64), self.embed_weight)
            if self._embed_scale is not None:
                out = out * self._embed_scale
        return out.to("cpu", torch.float32).clone(memory_format=torch.contiguous_format)  # not an inference tensor

    def embed_ids(self, ids: list[int]) -> torch.Tensor:
        """:meth:`embed` of one sequence of token ids: float32 CPU hidden states ``(1, len(ids), hidden)``. The
        route client calls it on its executor, so that torch is imported and run off the event loop."""
        return self.embed(torch.tensor([ids], dtype=torch.long))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm, LM head, then soft-capping where the architecture has it:
        float32 ``(batch, tokens, hidden)`` -> float32 CPU ``(batch, tokens, vocab)``.

        Raises:
            ValueError: wrong rank or last dimension.
        """
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden must have shape (batch, tokens, {self.hidden_size})")
        with torch.inference_mode():
            h = self.norm(hidden.to(self.device, torch.float32))
            out = torch.nn.functional.linear(h, self.lm_head_weight)
            if self._softcap is not None:
                out = torch.tanh(out / self._softcap) * self._softcap
        return out.to("cpu", torch.float32).clone()

    def warm_up(self) -> int:
        """Embed token 0 and take the greedy token after it: the process's first embedding lookup, RMSNorm and
        LM-head matmul (allocator and kernel set-up, hundreds of ms in a fresh process) happen here rather than in
        the first generation; and load the tokenizer (when the dir has one) and decode that token, since the API
        decodes every generation's tokens (loading SmolLM2's tokenizer took ~1.5 s on a loaded 2-core machine, in
        the first generation's reply before). Returns that token."""
        tok = self.next_token(self.embed(torch.zeros(1, 1, dtype=torch.long)))
        if self.tokenizer is not None:
            self.tokenizer.decode([tok], skip_special_tokens=True)
            self.tokenizer.encode("warm")
        return tok

    def next_token(self, hidden: torch.Tensor) -> int:
        """Greedy next token: argmax of the logits at the last position of ``hidden`` ``(1, tokens, hidden)``.

        Raises:
            ValueError: batch size other than 1, no position, or as :meth:`logits`.
        """
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[1] < 1:
            raise ValueError("next_token needs hidden of shape (1, tokens >= 1, hidden)")
        return int(self.logits(hidden[:, -1:])[0, -1].argmax())

