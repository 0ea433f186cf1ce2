"""The ``--model``/``--model-cache`` and ``--gpu`` flags that ``node start`` and ``node devnet`` share, resolved to a
model dir and a torch device (both commands exit with a clear message when a flag names nothing usable), and a model
id the cache lacks fetched from the bootstrap peers before ``node start`` serves it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

from .compute.model import ManifestError, block_file, default_cache_dir, ensure_smollm2, load_manifest, make_tiny
from .ledger.genesis import Genesis
from .models.lookup import model_dir_of
from .models.registry import RegistryError


def resolve_model(args: argparse.Namespace) -> Path:
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


def fetch_missing_model(args: argparse.Namespace, genesis: Genesis, bootstrap: list[str]) -> None:
    """``node start --model MODEL_ID`` (64 hex digits) of a model this machine's cache lacks: fetch it from the
    bootstrap peers first, as ``node model fetch`` does (checked against the id, block by block in checked chunks),
    and register it as ``m-`` and its first 12 hex digits -- only the blocks of ``--span A:B``, or the whole model
    with its head for a node without a span (a client). Exits with the reason when it cannot."""
    ref = args.model.lower()
    if len(ref) != 64 or any(c not in "0123456789abcdef" for c in ref):
        return
    cache = args.model_cache or default_cache_dir()
    try:
        model_dir_of(ref, cache)
        return
    except (RegistryError, ManifestError, FileNotFoundError):
        pass
    # local: node.verify.modelfetch imports the converter and torch (~2 s); only a fetch needs it
    from .verify.modelfetch import FetchError, default_name, fetch_model

    if not bootstrap:
        sys.exit(f"node: --model {ref[:16]}…: not in {cache}, and no --bootstrap peers to fetch it from")
    span = args.span
    if span == "all" or span is None:
        blocks = None
    elif span[0] == "auto":
        sys.exit(f"node: --model {ref[:16]}… is not in {cache}: give --span A:B to fetch the blocks you will serve "
                 "(--span auto needs the model's size first)")
    else:
        blocks = range(span[0], span[1])
    what = "the whole model" if blocks is None else f"blocks {blocks.start}:{blocks.stop}"
    print(f"node: model {ref[:16]}… is not in {cache}: fetching {what} from {len(bootstrap)} bootstrap peer(s)",
          file=sys.stderr, flush=True)
    try:
        entry = trio.run(fetch_model, genesis, list(bootstrap), bytes.fromhex(ref), cache,
                             default_name(bytes.fromhex(ref)), blocks)
    except (FetchError, RegistryError) as err:
        sys.exit(f"node: fetching model {ref[:16]}…: {err}")
    print(f"node: fetched {entry.name} ({entry.source}, {entry.bytes / 1e6:.1f} MB)", file=sys.stderr, flush=True)


def check_span_held(args: argparse.Namespace, model_dir: Path, num_blocks: int) -> None:
    """Exit with the command that fetches them when blocks of ``--span A:B`` are missing from ``model_dir`` (a
    model fetched or converted for another span)."""
    span = args.span
    if span is None or span == "auto" or span == "all" or span[0] == "auto" or span[1] > num_blocks:
        return
    missing = [i for i in range(span[0], span[1]) if not (model_dir / block_file(i)).is_file()]
    if missing:
        sys.exit(f"node: --span {span[0]}:{span[1]}: this machine's copy of the model lacks blocks "
                 f"{', '.join(map(str, missing[:8]))}{' …' if len(missing) > 8 else ''}; fetch them with "
                 f"'node model fetch {load_manifest(model_dir).model_id.hex()} --from PEER --blocks "
                 f"{span[0]}:{span[1]} --name NAME' and start with --model NAME")
