"""The ``--model``/``--model-cache`` and ``--gpu`` flags that ``node start`` and ``node devnet`` share, resolved to a
model dir and a torch device (both commands exit with a clear message when a flag names nothing usable)."""

from __future__ import annotations

import sys
from pathlib import Path

from .compute.model import ManifestError, default_cache_dir, ensure_smollm2, make_tiny
from .models.lookup import model_dir_of
from .models.registry import RegistryError


def resolve_model(args) -> Path:
    """The model dir ``args.model`` names in ``args.model_cache`` (default: :func:`default_cache_dir`): ``tiny``
    (built once, seed 0), ``smollm2`` (converted once from the bundled GGUF), or the name or id of a model added
    with ``node model add``. Exits (``SystemExit`` with the reason) when it names none."""
    cache = args.model_cache or default_cache_dir()
    if args.model == "tiny":
        return make_tiny(cache, seed=0)  # imports torch only to build it, the first time
    if args.model == "smollm2":
        return ensure_smollm2(cache)  # likewise, to convert it
    try:
        return model_dir_of(args.model, cache)
    except (RegistryError, ManifestError, FileNotFoundError) as e:
        sys.exit(f"node: --model {args.model}: {e}")


def resolve_device(gpu: int | None) -> str:
    """``"cpu"`` or ``"cuda:N"``; exits with a clear message when CUDA device N does not exist."""
    if gpu is None:
        return "cpu"
    # local: torch takes ~2 s to import; only --gpu needs it, the CPU path never pays for it
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"node: --gpu {gpu}: no CUDA device is available (torch {torch.__version__}, "
                 f"built with CUDA {torch.version.cuda}); run without --gpu to use the CPU")
    if not 0 <= gpu < torch.cuda.device_count():
        sys.exit(f"node: --gpu {gpu}: only {torch.cuda.device_count()} CUDA device(s) present")
    return f"cuda:{gpu}"
