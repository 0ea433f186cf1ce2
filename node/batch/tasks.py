"""Executing one batch item, and the canonical bytes of its result (what a worker commits to).

**Model path.** A batch worker runs the whole model in its own process: :func:`node.compute.reference.load_causal_lm`
(one ordinary ``<X>ForCausalLM`` rebuilt from the model dir, every file checked against the manifest) and
:func:`node.compute.reference.local_generate` (greedy, a ``DynamicCache``), the same single-process path committees
and tests compare swarm routes against. It does not route items through other servers' spans: a replica must be
one worker's work, or a dishonest span server on a shared route would make honest replicas disagree. torch and
the model are loaded at the first item (on the executor), not with this module: every node builds a runner.

**generate**: exactly ``max_tokens`` greedy new token ids after the prompt (no stop at EOS, as
:func:`local_generate`), result ``pack({"ids": [...]})``. Equal results mean equal token ids.

**score**: the per-token log-likelihoods (natural log, float32) of tokens ``1..n-1`` of the text given their
prefix, one forward pass. Float results differ in their last bits between thread counts and BLAS kernels, and the
ledger compares hashes, so each value is quantized to the grid :data:`SCORE_GRID` (``round(ll / grid)``, an int)
before packing: ``pack({"ids": [...], "ll_q": [...], "grid_log2": -7})``, a grid of 2^-7 = 0.0078 nats.
Calibration (measured on the tiny random Llama, 40 random texts of 20..200 characters, this module's own path;
``tests/batch/test_items.py`` checks the thread case on 4 texts): float32 on 1 and 2 torch threads gave
bit-identical log-likelihoods (largest
difference 0.0 nats; small matrices take the same kernels), so the margin to the grid's half step (0.0039 nats) is
the whole half step; bf16 weights and activations moved the values by 0.0002–3.3 nats (median 0.11, 14 grid steps),
so a ``bf16`` worker's bytes differed from the honest ones on 40 of 40 texts. Not measured: larger models, whose BLAS
kernels may differ between thread counts by ~1e-6 (an estimate for float32 sums); an honest pair then
disagrees only when a value falls within that of a rounding boundary
(about 1e-6 / 2^-7 ≈ 1e-4 per token), and with k = 3 and a quorum of 2 the third replica still decides the item.

Text is tokenized with the model's ``tokenizer.json`` when it has one, else as bytes modulo the vocabulary (as
:func:`node.compute.train.encode_text`; the tiny test models ship no tokenizer).

An item that cannot be run (prompt + tokens over the model's ``max_length``, an id outside the vocabulary, a text
of fewer than 2 tokens) gets the canonical result ``pack({"error": <code>})``: every honest worker produces the same
bytes, so the item is decided, and the requester sees why.

Test switches (devnet/test chains; ``node start --fault``): ``corrupt`` changes the last generated id (generate) or
adds 0.5 nats to every value (score); ``bf16`` scores with bf16 weights and activations.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..compute.model import load_manifest
from ..encoding import pack
from ..ledger.core.batchtx import GENERATE, SCORE

if TYPE_CHECKING:
    import torch

GRID_LOG2 = -7
SCORE_GRID = 2.0 ** GRID_LOG2  # nats per quantization step of a score result
BATCH_FAULTS = ("corrupt", "bf16")


class Tokenizer(Protocol):
    """What :class:`ItemRunner` needs of a Hugging Face tokenizer."""

    def encode(self, text: str, /) -> list[int]: ...


class ItemRunner:
    """Runs items of either kind on the full model of ``model_dir`` (loaded on first use). Not thread-safe: call it
    from the node's torch executor only.

    Args:
        fault: ``None``, ``corrupt`` or ``bf16`` (test switches; see the module docstring).

    Raises:
        ValueError: unknown fault.
    """

    def __init__(self, model_dir: Path, fault: str | None = None) -> None:
        if fault not in (None, *BATCH_FAULTS):
            raise ValueError(f"batch fault must be one of {', '.join(BATCH_FAULTS)} (got {fault!r})")
        self.model_dir, self.fault = Path(model_dir), fault
        self.manifest = load_manifest(self.model_dir)
        self._model: torch.nn.Module | None = None
        self._bf16: torch.nn.Module | None = None
        self._tok: Tokenizer | None = None
        self._tok_loaded = False

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            # local: compute.reference imports torch and transformers (~4 s); a node without batch work never does
            from ..compute.reference import load_causal_lm

            self._model = load_causal_lm(self.model_dir)
        return self._model

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``: the model's tokenizer, or UTF-8 bytes modulo the vocabulary without one."""
        if not self._tok_loaded:
            if (self.model_dir / "tokenizer.json").exists():
                # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(str(self.model_dir), trust_remote_code=False)
            self._tok_loaded = True
        if self._tok is not None:
            return list(self._tok.encode(text))
        return [b % self.manifest.vocab_size for b in text.encode("utf-8")]

    def run(self, kind: str, item: dict[str, Any], max_tokens: int) -> bytes:
        """The canonical result bytes of ``item`` (already checked by :func:`node.batch.items.parse_items`).

        Raises:
            ValueError: unknown kind (an item that cannot be run returns an ``error`` result instead).
        """
        if kind == GENERATE:
            return pack(self._generate(item, max_tokens))
        if kind == SCORE:
            return pack(self._score(item["text"]))
        raise ValueError(f"unknown task kind {kind!r}")

    def _ids_ok(self, ids: list[int], extra: int) -> str | None:
        m = self.manifest
        if any(not 0 <= t < m.vocab_size for t in ids):
            return "token_out_of_vocab"
        if len(ids) + extra > m.max_length:
            return "too_long"
        return None

    def _generate(self, item: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        ids = list(item["prompt_ids"]) if "prompt_ids" in item else self.tokenize(item["prompt"])
        if not ids:
            return {"error": "empty_prompt"}
        if (err := self._ids_ok(ids, max_tokens)) is not None:
            return {"error": err}
        # local: compute.reference imports torch and transformers (~4 s); a node without batch work never does
        from ..compute.reference import local_generate

        out = local_generate(self.model_dir, ids, max_tokens, model=self.model)
        if self.fault == "corrupt" and out:
            out[-1] = (out[-1] + 1) % self.manifest.vocab_size
        return {"ids": out}

    def _score(self, text: str) -> dict[str, Any]:
        ids = self.tokenize(text)
        if len(ids) < 2:
            return {"error": "too_short"}
        if (err := self._ids_ok(ids, 0)) is not None:
            return {"error": err}
        ll = self.log_likelihoods(ids)
        if self.fault == "corrupt":
            ll = [x + 0.5 for x in ll]
        return {"ids": ids, "ll_q": quantize(ll), "grid_log2": GRID_LOG2}

    def log_likelihoods(self, ids: list[int]) -> list[float]:
        """``log p(ids[i] | ids[:i])`` for ``i = 1..len(ids)-1``, natural log, computed in float32 (bf16 under the
        ``bf16`` switch), as Python floats."""
        import torch  # local: torch takes ~2 s to import; a node without batch work never loads it

        model = self.model
        if self.fault == "bf16":
            if self._bf16 is None:
                self._bf16 = copy.deepcopy(model).to(torch.bfloat16)
            model = self._bf16
        x = torch.tensor([ids], dtype=torch.long)
        with torch.inference_mode():
            logits = model(input_ids=x).logits[0, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(1, x[0, 1:, None])[:, 0]
        return [float(v) for v in lp]


def quantize(values: list[float]) -> list[int]:
    """Each value as ``round(v / SCORE_GRID)`` (an int; banker's rounding of a float is deterministic); a non-finite
    value becomes the sentinel ``-2**62`` so that NaN results are comparable too."""
    return [round(v / SCORE_GRID) if math.isfinite(v) else -(2**62) for v in values]


def dequantize(q: list[int]) -> list[float | None]:
    """Inverse of :func:`quantize` up to the grid (``None`` for the non-finite sentinel)."""
    return [None if v == -(2**62) else v * SCORE_GRID for v in q]
