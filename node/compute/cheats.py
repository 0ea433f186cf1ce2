"""How a cheating server cheats (test and devnet switches only; a committee must catch every one of them).

Output cheats change what :meth:`SpanModel.forward` returns: ``corrupt`` (Gaussian noise of half the output's
std), ``random`` (fresh random states with the output's mean and std), ``zeros``, ``nan`` (NaN in one of every 8
positions), ``half-tokens`` (only half the tokens processed: the first half of a multi-token call, every other
single-token step; the rest passed through unchanged), ``replay`` (outputs recorded from an earlier session returned for
the same positions). Weight cheats run :meth:`forward` on other weights than the committed model: ``skip-block`` (the
span's last block skipped), ``perturb`` (every weight scaled by 1 + 1 % Gaussian noise), ``other-model`` (random weights
of the same shapes), ``bf16`` (the span in bfloat16), ``int8`` (every linear weight quantized to int8 and back as
``node model add --quantize int8`` does: the cheaper int8 copy served under the float model's id).
:meth:`SpanModel.prefill` — what a committee runs — is never affected.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from ..encoding import H, pack
from .int8 import dequantize_weight, is_linear_weight, quantize_weight

OUTPUT_FAULTS = ("corrupt", "random", "zeros", "nan", "half-tokens", "replay")
WEIGHT_FAULTS = ("skip-block", "perturb", "other-model", "bf16", "int8")
FAULTS = (None, *OUTPUT_FAULTS, *WEIGHT_FAULTS)


def _gen(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(H(pack(list(parts)))[:8], "little") & (2**63 - 1))


@torch.no_grad()
def cheat_net(net: torch.nn.Module, fault: str, seed: bytes) -> torch.nn.Module | None:
    """A modified copy of a span's ``LlamaModel`` for a weight cheat; None for output cheats, or when
    ``skip-block`` leaves no block (then the span passes its input through)."""
    if fault not in WEIGHT_FAULTS:
        return None
    cheat: Any = copy.deepcopy(net)  # a transformers decoder of any family (layers, config): no one type
    if fault == "skip-block":
        if len(cheat.layers) < 2:
            return None
        cheat.config = copy.deepcopy(cheat.config)
        cheat.config.num_hidden_layers -= 1
        cheat.layers = cheat.layers[:-1]
    elif fault in ("perturb", "other-model"):
        for name, p in cheat.named_parameters():
            g = _gen(seed, fault, name)
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p)
            if fault == "perturb":
                p.mul_(1 + 0.01 * noise)
            else:
                p.copy_(noise * p.float().std().clamp_min(1e-3).to(p) + (1.0 if name.endswith("norm.weight") else 0.0))
    elif fault == "bf16":
        cheat = cheat.to(torch.bfloat16)
    elif fault == "int8":
        for name, p in cheat.named_parameters():
            if is_linear_weight(name, p):
                p.copy_(dequantize_weight(*quantize_weight(p)).to(p))
    done: torch.nn.Module = cheat.eval().requires_grad_(False)
    return done


def apply_output_fault(fault: str | None, hidden: torch.Tensor, out: torch.Tensor, past: int, seed: bytes,
                       replay: dict[int, torch.Tensor]) -> torch.Tensor:
    """``out`` (``(batch, tokens, hidden)``, positions ``past..past+tokens-1``) as a cheater would return it."""
    t = out.shape[1]
    if fault == "corrupt":
        noise = torch.randn(out.shape, generator=_gen(seed, past, list(out.shape)), dtype=torch.float32)
        return out + noise * (0.5 * out.std().clamp_min(1e-6))
    if fault == "random":
        fake = torch.randn(out.shape, generator=_gen(seed, "random", past, list(out.shape)), dtype=torch.float32)
        return fake * out.std().clamp_min(1e-6) + out.mean()
    if fault == "zeros":
        return torch.zeros_like(out)
    if fault == "nan":
        out = out.clone()
        for i in range(t):
            if (past + i) % 8 == 7:
                out[:, i, :] = float("nan")
        return out
    if fault == "half-tokens":  # half of the work: the second half of a call, or every other single step
        k = math.ceil(t / 2) if t > 1 else (0 if past % 2 else 1)
        return torch.cat([out[:, :k], hidden[:, k:].to(out)], dim=1)
    if fault == "replay":
        rows = []
        for i in range(t):
            p = past + i
            if p in replay and replay[p].shape == out[:, i].shape:
                rows.append(replay[p])
            else:
                replay[p] = out[:, i].clone()
                rows.append(out[:, i])
        return torch.stack(rows, dim=1)
    return out
