"""Deterministic LoRA fine-tuning in segments, replayable by a committee.

A job fixes the base model, the dataset (raw text, addressed by its hash), the LoRA rank and target modules, the
number of steps, batch size, sequence length, learning rate and seed. Everything else is derived:

* **Initial adapter**: peft's LoRA init (A Kaiming-uniform, B zero) drawn from generators seeded with
  ``H(seed ‖ parameter name)`` (never the process-global RNG).
* **Batches**: the text is tokenized (the model's tokenizer; raw bytes modulo the vocabulary for the tiny test
  model), the first 90 % of tokens are training data and the last 10 % held out. Step ``s`` reads ``batch_size``
  windows of ``seq_len + 1`` tokens at offsets drawn from a generator seeded with ``H(seed ‖ s)``.
* **Optimizer**: AdamW (β = 0.9/0.999, ε = 1e-8, no weight decay). Its moments are part of the **training
  state**, so a segment can be replayed from the state before it alone.

The training state is an ordered list of tensors — for each trainable parameter (sorted by name): the weight,
Adam's ``exp_avg`` and ``exp_avg_sq``; then ``[step]`` as int64 — and its id is the RFC 9162 Merkle root of their
commitments (:func:`node.encoding.commitments_root`). A segment receipt commits to the state before and after,
and to the Merkle root of the batches it trained on.

``fault`` (test and devnet only) makes a worker cheat: ``"skip-steps"`` trains one step fewer than it claims,
``"other-data"`` trains on batches of another seed while committing the right batches, ``"fake-adapter"`` reports
a perturbed state it never trained, ``"diverge"`` blows its adapter up so that its loss becomes NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..encoding import H, commitments_root
from .model import load_manifest
from .reference import load_causal_lm

HELDOUT_FRACTION = 0.1


@dataclass(frozen=True)
class TrainSpec:
    """Hyperparameters fixed by a job. ``lr`` is a float learning rate; lengths in tokens."""

    rank: int
    targets: tuple[str, ...]
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    segment_steps: int


def encode_text(model_dir: Path, text: bytes) -> torch.Tensor:
    """Token ids (int64, 1-D) of the dataset ``text``: the model's tokenizer, or bytes mod vocab without one."""
    tok_file = Path(model_dir) / "tokenizer.json"
    if tok_file.exists():
        # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
        return torch.tensor(tok.encode(text.decode("utf-8", errors="replace")), dtype=torch.long)
    vocab = load_manifest(Path(model_dir)).vocab_size
    return torch.tensor(list(text), dtype=torch.long) % vocab


def split_tokens(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(training tokens, held-out tokens): the last ``HELDOUT_FRACTION`` of the text is held out."""
    cut = int(len(ids) * (1 - HELDOUT_FRACTION))
    return ids[:cut], ids[cut:]


def batch_for_step(train_ids: torch.Tensor, spec: TrainSpec, step: int) -> torch.Tensor:
    """The batch of step ``step``: int64 ``(batch_size, seq_len + 1)`` windows of the training tokens.

    Raises:
        ValueError: the training text is shorter than one window.
    """
    n = len(train_ids) - spec.seq_len - 1
    if n < 1:
        raise ValueError(f"dataset too short: {len(train_ids)} training tokens for windows of {spec.seq_len + 1}")
    g = torch.Generator().manual_seed(int.from_bytes(H(b"tally/batch/v1", str(spec.seed).encode(),
                                                       str(step).encode())[:8], "little") & (2**63 - 1))
    offsets = torch.randint(0, n, (spec.batch_size,), generator=g)
    return torch.stack([train_ids[o:o + spec.seq_len + 1] for o in offsets.tolist()])


@torch.no_grad()
def seeded_lora_init_(names: list[str], params: Sequence[torch.Tensor], seed: int) -> None:
    """peft's LoRA init in place (A Kaiming-uniform with a = √5, B zero), drawn from a generator seeded with
    ``H(seed ‖ parameter name)`` rather than the process-global RNG, which other threads may be using."""
    for name, p in zip(names, params, strict=True):
        if "lora_B" in name:
            p.zero_()
        else:
            s = int.from_bytes(H(b"tally/lora-init/v1", str(seed).encode(), name.encode())[:8],
                               "little") & (2**63 - 1)
            g = torch.Generator().manual_seed(s)
            cpu = torch.empty(p.shape, dtype=p.dtype)
            torch.nn.init.kaiming_uniform_(cpu, a=math.sqrt(5), generator=g)
            p.copy_(cpu.to(p.device))


class Trainer:
    """A base model with a LoRA adapter (peft) and its AdamW state, trained step by step.

    Raises:
        ValueError: unknown target modules or bad hyperparameters.
    """

    def __init__(self, model_dir: Path, spec: TrainSpec, device: str = "cpu"):
        # local: peft adds ~4 s to transformers' import; loaded only to train
        from peft import LoraConfig, get_peft_model

        if spec.rank < 1 or spec.steps < 1 or spec.batch_size < 1 or spec.seq_len < 2 or not spec.targets:
            raise ValueError("rank, steps, batch_size >= 1, seq_len >= 2 and at least one target module")
        self.spec, self.device = spec, torch.device(device)
        base = load_causal_lm(Path(model_dir))
        self.model = get_peft_model(base, LoraConfig(r=spec.rank, lora_alpha=2 * spec.rank,
                                                     target_modules=list(spec.targets), lora_dropout=0.0))
        self.model.to(self.device)
        self.names = sorted(n for n, p in self.model.named_parameters() if p.requires_grad)
        params = dict(self.model.named_parameters())
        self.params = [params[n] for n in self.names]
        self._init_lora()
        self.opt = torch.optim.AdamW(self.params, lr=spec.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        for p in self.params:  # materialize the moments so the state is complete from step 0
            self.opt.state[p]["step"] = torch.tensor(0.0)
            self.opt.state[p]["exp_avg"] = torch.zeros_like(p)
            self.opt.state[p]["exp_avg_sq"] = torch.zeros_like(p)
        self.step = 0

    def _init_lora(self) -> None:
        seeded_lora_init_(self.names, self.params, self.spec.seed)

    # ------------------------------------------------------------------ state

    def state_tensors(self) -> list[torch.Tensor]:
        """The training state as an ordered list of CPU tensors (see module docstring)."""
        out: list[torch.Tensor] = []
        for p in self.params:
            st = self.opt.state[p]
            out += [p.detach().cpu().clone(), st["exp_avg"].detach().cpu().clone(),
                    st["exp_avg_sq"].detach().cpu().clone()]
        out.append(torch.tensor([self.step], dtype=torch.int64))
        return out

    def state_root(self) -> bytes:
        return commitments_root(self.state_tensors())

    def load_state(self, tensors: list[torch.Tensor]) -> None:
        """Restore a state from :meth:`state_tensors` output.

        Raises:
            ValueError: wrong number, shapes or dtypes of tensors.
        """
        if len(tensors) != 3 * len(self.params) + 1:
            raise ValueError("training state has the wrong number of tensors")
        with torch.no_grad():
            for i, p in enumerate(self.params):
                w, m, v = tensors[3 * i:3 * i + 3]
                if w.shape != p.shape or m.shape != p.shape or v.shape != p.shape or w.dtype != p.dtype:
                    raise ValueError(f"training state tensor {self.names[i]} has the wrong shape or dtype")
                p.copy_(w.to(self.device))
                st = self.opt.state[p]
                st["exp_avg"].copy_(m.to(self.device))
                st["exp_avg_sq"].copy_(v.to(self.device))
        last = tensors[-1]
        if last.dtype != torch.int64 or last.numel() != 1:
            raise ValueError("training state must end with the step count")
        self.step = int(last.item())
        for p in self.params:
            self.opt.state[p]["step"] = torch.tensor(float(self.step))

    # ------------------------------------------------------------------ training

    def train_steps(self, train_ids: torch.Tensor, step_start: int, step_end: int,
                    fault: str | None = None) -> tuple[list[float], list[torch.Tensor]]:
        """Train steps ``[step_start, step_end)``. Returns the per-step losses (nats/token; NaN stays NaN)
        and the batches as committed (int64 ``(batch_size, seq_len + 1)`` each).

        Raises:
            ValueError: ``step_start`` is not the state's step.
        """
        if step_start != self.step:
            raise ValueError(f"state is at step {self.step}, segment starts at {step_start}")
        self.model.train()
        losses: list[float] = []
        batches = []
        for s in range(step_start, step_end):
            batch = batch_for_step(train_ids, self.spec, s)
            batches.append(batch)
            if fault == "skip-steps" and s == step_end - 1:
                losses.append(losses[-1] if losses else float("nan"))
                continue
            if fault == "diverge" and s == step_start:
                with torch.no_grad():  # blow the adapter up: the forward pass overflows to inf/NaN
                    for name, p in zip(self.names, self.params, strict=True):
                        if "lora_B" in name:
                            p.fill_(1e38)
            used = batch
            if fault == "other-data":
                other = TrainSpec(**{**self.spec.__dict__, "seed": self.spec.seed + 1})
                used = batch_for_step(train_ids, other, s)
            x = used.to(self.device)
            out = self.model(input_ids=x[:, :-1], use_cache=False)
            loss = self._shifted_loss(out.logits, x[:, 1:])
            self.opt.zero_grad(set_to_none=False)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            self.opt.step()
            losses.append(float(loss.detach()))
        self.step = step_end
        if fault == "fake-adapter":
            with torch.no_grad():
                g = torch.Generator().manual_seed(self.spec.seed)
                for p in self.params:
                    p.add_(torch.randn(p.shape, generator=g).to(p) * 0.01 * (p.std() + 1e-3))
        return losses, batches

    @staticmethod
    def _shifted_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 targets.reshape(-1))

    @torch.no_grad()
    def eval_loss(self, ids: torch.Tensor, with_adapter: bool = True, max_windows: int = 16) -> float:
        """Mean next-token loss (nats/token) over up to ``max_windows`` consecutive windows of ``ids``."""
        self.model.eval()
        L = self.spec.seq_len + 1
        windows = [ids[i:i + L] for i in range(0, len(ids) - L + 1, L)][:max_windows]
        if not windows:
            raise ValueError("held-out text shorter than one window")
        x = torch.stack(windows).to(self.device)
        if with_adapter:
            logits = self.model(input_ids=x[:, :-1], use_cache=False).logits
        else:
            with self.model.disable_adapter():
                logits = self.model(input_ids=x[:, :-1], use_cache=False).logits
        return float(self._shifted_loss(logits, x[:, 1:]))

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """LoRA weights only, peft names (for ``adapter_model.safetensors``)."""
        # local: peft adds ~4 s to transformers' import; loaded only to train
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(self.model).items()}


def state_distance(committed: list[torch.Tensor], replayed: list[torch.Tensor]) -> float:
    """Worst relative L2 difference over the tensors of two training states (weights and Adam moments);
    ``inf`` for mismatched structure or shapes, or NaN/inf at different places (matching non-finite
    patterns — a diverged run replayed — compare by their finite entries)."""
    if len(committed) != len(replayed):
        return math.inf
    worst = 0.0
    for a, b in zip(committed, replayed, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            return math.inf
        if a.dtype == torch.int64:
            if not torch.equal(a, b):
                return math.inf
            continue
        a64, b64 = a.double(), b.double()
        fa, fb = torch.isfinite(a64), torch.isfinite(b64)
        # an honest run that diverged replays to the same NaN/inf pattern: compare patterns, then finite parts
        if not torch.equal(fa, fb) or not torch.equal(torch.isnan(a64), torch.isnan(b64)) \
                or not torch.equal(a64[torch.isinf(a64)], b64[torch.isinf(b64)]):
            return math.inf
        a64, b64 = a64[fa], b64[fb]
        worst = max(worst, float((a64 - b64).norm() / (b64.norm() + 1e-12)))
    return worst


def mean_loss_ppm(losses: list[float]) -> int:
    """Mean loss in millionths of a nat per token, or -1 when any loss is not finite (diverged)."""
    if not losses or not all(math.isfinite(x) for x in losses):
        return -1
    return round(sum(losses) / len(losses) * 1e6)
