"""The inner loop of a collaborative training run: H AdamW steps of one worker, on LoRA adapters or all params.

A worker of round r loads the global parameters θ_r (:meth:`InnerTrainer.load_params`) and its inner optimizer
state (:meth:`InnerTrainer.load_opt_state`, or :meth:`InnerTrainer.reset_opt_state` under the reset policy),
trains one AdamW step per assigned batch (:meth:`InnerTrainer.train`) and reads back θ_worker
(:meth:`InnerTrainer.params`) and the new state (:meth:`InnerTrainer.opt_state`). A committee replays the same
calls from the committed tensors. The tensor-list layouts are the contract of ``docs``/training-spec (issue 12):

* **θ**: the trainable tensors, float32, in :attr:`InnerTrainer.names` order (sorted parameter names). LoRA: the
  peft ``lora_A``/``lora_B`` weights; ``all``: every parameter of the model (``lm_head`` untied from the embedding,
  as :func:`node.compute.reference.load_causal_lm` loads it).
* **opt state**: ``[exp_avg_0, exp_avg_sq_0, exp_avg_1, exp_avg_sq_1, ..., residual_0, residual_1, ...,
  step]`` — AdamW moments per parameter in names order, then the codec's error-feedback residual per parameter
  (zeros for codecs without one), then the inner step count (int64, shape [1]).

The initial θ_0 of a LoRA run is the seeded init of :class:`node.compute.train.Trainer` (B = 0, A from
``H(seed ‖ name)``); of an ``all`` run the model dir's weights. AdamW: β 0.9/0.999, ε 1e-8, weight decay 0
(torch's single-tensor implementation on CPU; bit-identical when replayed at the same torch thread count).

:func:`make_scratch_model` writes a small randomly initialised Llama with a byte-level vocabulary (no tokenizer:
:func:`node.compute.train.encode_text` reads raw bytes) for from-scratch training comparisons on 2 CPU cores.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from ..compute.model import save_model_dir
from ..compute.reference import load_causal_lm
from ..compute.train import seeded_lora_init_

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
EVAL_CHUNK = 64  # windows per forward pass in eval_loss (bounds memory, not the result)

SCRATCH_CONFIG = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=256,
    vocab_size=256,  # one token per byte (encode_text without a tokenizer: bytes mod vocab)
    max_position_embeddings=512,
    tie_word_embeddings=False,
    initializer_range=0.02,
)


class Trainable(str, Enum):
    """Which parameters a run trains."""

    LORA = "lora"
    ALL = "all"


class InnerTrainer:
    """One worker's model and inner AdamW state.

    Args:
        model_dir: a Tally model dir (:mod:`node.compute.model`).
        trainable: ``"lora"`` (peft LoRA, alpha = 2·rank, no dropout, on ``targets``) or ``"all"``.
        rank, targets: LoRA rank and target module names (ignored for ``"all"``).
        lr: inner AdamW learning rate.
        seed: seed of the LoRA init (``H(seed ‖ name)``, see :func:`node.compute.train.seeded_lora_init_`).
        device: torch device; the tensor lists returned are always CPU.

    Raises:
        ValueError: unknown ``trainable``, rank < 1 or no targets for LoRA, lr not a positive finite number,
            or targets that match no module of the model.
    """

    def __init__(self, model_dir: Path, trainable: str, rank: int, targets: tuple[str, ...], lr: float,
                 seed: int, device: str = "cpu"):
        try:
            self.trainable = Trainable(trainable)
        except ValueError:
            raise ValueError(f"trainable must be 'lora' or 'all', got {trainable!r}") from None
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {lr!r}")
        self.device = torch.device(device)
        model = load_causal_lm(Path(model_dir))
        if self.trainable is Trainable.LORA:
            if rank < 1 or not targets:
                raise ValueError("a LoRA run needs rank >= 1 and at least one target module")
            # imported here, not at the top: peft pulls in transformers (~4 CPU-s), and every node imports this
            # module at start (node.training.worker) though few ever train a run
            # local: peft adds ~4 s to transformers' import; loaded only to train
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets),
                                                     lora_dropout=0.0))
        else:
            model.requires_grad_(True)
        self.model = model.to(self.device)
        named = dict(self.model.named_parameters())
        self.names: list[str] = sorted(n for n, p in named.items() if p.requires_grad)
        self._params = [named[n] for n in self.names]
        if self.trainable is Trainable.LORA:
            seeded_lora_init_(self.names, self._params, seed)
        self.opt = torch.optim.AdamW(self._params, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=0.0,
                                     foreach=False)
        self._residual = [torch.zeros(p.shape, dtype=torch.float32) for p in self._params]
        self.reset_opt_state()

    # ------------------------------------------------------------------ parameters

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of θ's tensors, in names order."""
        return [tuple(p.shape) for p in self._params]

    def params(self) -> list[torch.Tensor]:
        """θ: copies of the trainable tensors (CPU, float32, contiguous), in names order."""
        return [p.detach().to("cpu", torch.float32).clone().contiguous() for p in self._params]

    def load_params(self, ts: list[torch.Tensor]) -> None:
        """Set θ to ``ts`` (a :meth:`params`-shaped list). The optimizer state is left as it is.

        Raises:
            ValueError: wrong count, shape or dtype (nothing is changed then).
        """
        self._check(ts, [(f"param {n}", p.shape, torch.float32) for n, p in zip(self.names, self._params, strict=True)])
        with torch.no_grad():
            for p, t in zip(self._params, ts, strict=True):
                p.copy_(t.to(self.device))

    # ------------------------------------------------------------------ optimizer state

    def opt_state(self) -> list[torch.Tensor]:
        """The inner state ``[m_0, v_0, m_1, v_1, ..., residual_0, ..., step]`` (CPU copies; see module doc)."""
        out: list[torch.Tensor] = []
        for p in self._params:
            st = self.opt.state[p]
            out += [st["exp_avg"].detach().cpu().clone().contiguous(),
                    st["exp_avg_sq"].detach().cpu().clone().contiguous()]
        out += [r.clone() for r in self._residual]
        out.append(torch.tensor([self.step], dtype=torch.int64))
        return out

    def load_opt_state(self, ts: list[torch.Tensor]) -> None:
        """Restore an :meth:`opt_state` list (moments, residuals, step).

        Raises:
            ValueError: wrong count, shape or dtype, or a negative step (nothing is changed then).
        """
        n = len(self._params)
        expect = []
        for name, p in zip(self.names, self._params, strict=True):
            expect += [(f"exp_avg {name}", p.shape, torch.float32), (f"exp_avg_sq {name}", p.shape, torch.float32)]
        expect += [(f"residual {name}", p.shape, torch.float32)
                   for name, p in zip(self.names, self._params, strict=True)]
        expect.append(("step", torch.Size([1]), torch.int64))
        self._check(ts, expect)
        step = int(ts[-1].item())
        if step < 0:
            raise ValueError(f"opt state step must be >= 0, got {step}")
        with torch.no_grad():
            for i, p in enumerate(self._params):
                st = self.opt.state[p]
                st["exp_avg"].copy_(ts[2 * i].to(self.device))
                st["exp_avg_sq"].copy_(ts[2 * i + 1].to(self.device))
                st["step"] = torch.tensor(float(step))
            self._residual = [t.detach().to("cpu", torch.float32).clone().contiguous() for t in ts[2 * n:3 * n]]
        self.step = step

    def reset_opt_state(self) -> None:
        """Zero the AdamW moments and the step count (the reset policy); the codec residual is kept."""
        for p in self._params:
            st = self.opt.state[p]
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self.step = 0

    def residuals(self) -> list[torch.Tensor]:
        """The codec's error-feedback residual per parameter (CPU float32 copies, names order)."""
        return [r.clone() for r in self._residual]

    def set_residuals(self, ts: list[torch.Tensor]) -> None:
        """Replace the residual (the second output of :func:`node.training.codec.encode`).

        Raises:
            ValueError: wrong count, shape or dtype (nothing is changed then).
        """
        self._check(ts, [(f"residual {n}", p.shape, torch.float32)
                         for n, p in zip(self.names, self._params, strict=True)])
        self._residual = [t.detach().to("cpu", torch.float32).clone().contiguous() for t in ts]

    # ------------------------------------------------------------------ training

    def train(self, batches: list[torch.Tensor]) -> list[float]:
        """One AdamW step per batch (int64 ``(batch_size, seq_len + 1)`` token windows: inputs ``[:, :-1]``,
        targets ``[:, 1:]``). Returns each step's training loss (nats/token, before the step; NaN stays NaN).

        Raises:
            ValueError: a batch that is not a 2-D integer tensor of windows of >= 2 tokens (checked up front).
        """
        for b in batches:
            self._check_windows(b)
        self.model.train()
        losses = []
        for b in batches:
            x = b.to(self.device, torch.long)
            logits = self.model(input_ids=x[:, :-1], use_cache=False).logits
            loss = _shifted_loss(logits, x[:, 1:])
            self.opt.zero_grad(set_to_none=False)
            torch.autograd.backward(loss)  # loss.backward(), whose signature torch leaves unannotated
            self.opt.step()
            self.step += 1
            losses.append(float(loss.detach()))
        return losses

    @torch.no_grad()
    def eval_loss(self, windows: torch.Tensor) -> float:
        """Mean next-token loss (nats/token) of the current θ over all ``windows`` (int64 ``(n, seq_len + 1)``).

        Raises:
            ValueError: ``windows`` is not a non-empty 2-D integer tensor of windows of >= 2 tokens.
        """
        self._check_windows(windows)
        self.model.eval()
        total, count = 0.0, 0
        for i in range(0, windows.shape[0], EVAL_CHUNK):
            x = windows[i:i + EVAL_CHUNK].to(self.device, torch.long)
            logits = self.model(input_ids=x[:, :-1], use_cache=False).logits
            n = x[:, 1:].numel()
            total += float(_shifted_loss(logits, x[:, 1:])) * n
            count += n
        return total / count

    # ------------------------------------------------------------------ checks

    @staticmethod
    def _check(ts: list[torch.Tensor], expect: list[tuple[str, torch.Size, torch.dtype]]) -> None:
        if not isinstance(ts, (list, tuple)) or len(ts) != len(expect):
            got = len(ts) if isinstance(ts, (list, tuple)) else type(ts).__name__
            raise ValueError(f"expected {len(expect)} tensors, got {got}")
        for t, (what, shape, dtype) in zip(ts, expect, strict=True):
            if not isinstance(t, torch.Tensor) or t.shape != shape or t.dtype != dtype:
                desc = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{what}: expected {tuple(shape)} {dtype}, got {desc}")

    @staticmethod
    def _check_windows(w: torch.Tensor) -> None:
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] < 1 or w.shape[1] < 2 \
                or w.dtype.is_floating_point or w.dtype == torch.bool:
            desc = f"{tuple(w.shape)} {w.dtype}" if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"expected a non-empty int64 (n, seq_len + 1) tensor of token windows, got {desc}")


def _shifted_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def make_scratch_model(out_dir: Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a small randomly initialised Llama (``SCRATCH_CONFIG`` updated by ``overrides``; weights from
    ``torch.manual_seed(seed)``, transformers' normal init with std ``initializer_range``) to ``out_dir`` in the
    Tally model-dir format, without a tokenizer (byte-level: token = byte mod vocab). For training from scratch.

    Deterministic for a seed and config; the global torch RNG state is restored afterwards. Returns ``out_dir``.

    Raises:
        ValueError: an override that is not a key of ``SCRATCH_CONFIG``.
    """
    # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
    from transformers import LlamaConfig, LlamaForCausalLM

    unknown = set(overrides) - set(SCRATCH_CONFIG)
    if unknown:
        raise ValueError(f"unknown scratch-model settings: {sorted(unknown)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**{**SCRATCH_CONFIG, **overrides}))
    save_model_dir(model, None, Path(out_dir), name=f"scratch-{seed}")
    return Path(out_dir)
