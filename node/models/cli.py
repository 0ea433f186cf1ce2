"""``node model add|list|remove``: the models this machine can serve besides the built-in ``smollm2`` and ``tiny``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from node.compute.families import SUPPORTED
from node.compute.model import default_cache_dir

from .registry import RegistryError

_EPILOG = (f"Architectures: {', '.join(sorted(SUPPORTED.values()))}. Serve an added model with "
           "'node start --model NAME' (or its id). Pickled checkpoints (pytorch_model.bin, *.pt) are refused.")


def add_model_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``model`` subcommand on the ``node`` parser's subparsers ``sub``."""
    m = sub.add_parser("model", help="add, list or remove the models this node can serve",
                       description="Convert a Hugging Face checkpoint directory (config.json, *.safetensors, "
                                   "tokenizer) or a GGUF file once into the model cache's per-block format, with "
                                   "a model id (Merkle root of the block, head and config hashes) and a name.",
                       epilog=_EPILOG)
    msub = m.add_subparsers(dest="model_cmd", required=True)
    cache_help = "model cache dir (default: $TALLY_MODEL_CACHE or ~/.cache/tally/models)"
    a = msub.add_parser("add", help="convert a checkpoint dir or GGUF file and register it", epilog=_EPILOG)
    a.add_argument("path", type=Path, metavar="SOURCE",
                   help="checkpoint directory or .gguf file; with --quantize also an added model's name or id, or "
                        "the built-in smollm2 / tiny")
    a.add_argument("--quantize", choices=["int8"],
                   help="register a weight-only int8 copy instead (per-output-channel symmetric int8 linear "
                        "weights; embeddings, norms and LM head stay float32): a separate model with its own id; "
                        "default name NAME-int8")
    a.add_argument("--name", help="name to serve it under (default: the directory or file name)")
    a.add_argument("--blocks", metavar="A:B", type=_span,
                   help="write only blocks A..B-1 and the head (a server of that span); every block is still read "
                        "and hashed, so the model id is the whole model's")
    a.add_argument("--storage", choices=["native", "float32", "bf16"], default="native",
                   help="how blocks are stored. native (default): a GGUF file's tensors in their GGUF types, "
                        "dequantized at load (disk about the GGUF's size), a checkpoint's 16-bit tensors in 16 "
                        "bits; float32: dequantized once (4 bytes per parameter); bf16: rounded to bfloat16 "
                        "(2 bytes per parameter; a new model id)")
    a.add_argument("--model-cache", type=Path, help=cache_help)
    f = msub.add_parser("fetch", help="fetch a model's blocks from peers that serve it (no conversion here)",
                        description="Fetch model MODEL_ID (64 hex digits, as 'node model list' or /v1/status shows "
                                    "it) from the nodes at --from: its manifest and config, checked against the "
                                    "id, then each block of --blocks (default: every block, the head and the "
                                    "tokenizer), each checked against the manifest; then register it in the "
                                    "model cache. Serve it with 'node start --model NAME --span A:B'.",
                        epilog="Example: node model fetch 111e59...ce320 --from /ip4/10.0.0.5/tcp/4001/p2p/12D3... "
                               "--blocks 8:16 --name big")
    f.add_argument("model_id", metavar="MODEL_ID", help="the model id (64 hex digits)")
    f.add_argument("--from", dest="peers", action="append", required=True, metavar="MULTIADDR",
                   help="a node that holds the model (its address with /p2p/PEER_ID); repeat for more")
    f.add_argument("--blocks", metavar="A:B", type=_span, help="only blocks A..B-1 (a server of that span)")
    f.add_argument("--name", help="name to serve it under (default: m- and the first 12 hex digits of the id)")
    f.add_argument("--genesis", type=Path, help="the chain's genesis file (default: the embedded devnet)")
    f.add_argument("--max-gb", type=float, default=64.0, help="refuse to fetch more than this many GB "
                                                              "(default: %(default)s)")
    f.add_argument("--model-cache", type=Path, help=cache_help)
    ls = msub.add_parser("list", help="the added models: name, id, architecture, blocks, hidden size, bytes")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.add_argument("--model-cache", type=Path, help=cache_help)
    r = msub.add_parser("remove", help="unregister an added model and delete its converted files")
    r.add_argument("ref", metavar="NAME|ID", help="model name, or its id (at least 8 leading hex digits)")
    r.add_argument("--model-cache", type=Path, help=cache_help)


def _span(text: str) -> range:
    """``A:B`` -> ``range(A, B)``; argparse turns the ValueError into a usage error."""
    a, sep, b = text.partition(":")
    if not sep or not a.isdigit() or not b.isdigit() or int(a) >= int(b):
        raise argparse.ArgumentTypeError(f"expected A:B with 0 <= A < B (blocks A..B-1), got {text!r}")
    return range(int(a), int(b))


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def run_model_command(args: argparse.Namespace) -> int:
    """Run ``node model ...``; returns the exit code (0 ok, 1 refused or failed: the message is on stderr)."""
    # local: node.models.convert imports torch (~2 s): only the model commands load it
    from .convert import add_model, list_models, remove_model
    from .ggufstream import Storage
    from .sources import CheckpointError

    cache = args.model_cache or default_cache_dir()
    try:
        if args.model_cmd == "add":
            e = add_model(args.path, cache, name=args.name, progress=True, quantize=args.quantize,
                          storage=Storage(args.storage), span=args.blocks)
            q = f" {e.quantization}" if e.quantization else ""
            print(f"added {e.name}: {e.architecture}{q}, {e.num_blocks} blocks, hidden {e.hidden_size}, "
                  f"{_human(e.bytes)}\nmodel id {e.model_id}\nserve it with: node start --model {e.name}")
            return 0
        if args.model_cmd == "list":
            entries = list_models(cache)
            if args.json:
                print(json.dumps([e.__dict__ for e in entries], indent=1))
                return 0
            if not entries:
                print(f"no added models in {cache} (built-in: smollm2, tiny); add one with: node model add PATH")
                return 0
            rows = [("NAME", "ID", "ARCHITECTURE", "QUANT", "BLOCKS", "HIDDEN", "SIZE")]
            rows += [(e.name, e.model_id[:16], e.architecture, e.quantization or "-", str(e.num_blocks),
                      str(e.hidden_size), _human(e.bytes)) for e in entries]
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            for r in rows:
                print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
            return 0
        e = remove_model(args.ref, cache)
        print(f"removed {e.name} ({e.model_id[:16]}…)")
        return 0
    except (CheckpointError, RegistryError, FileNotFoundError) as err:
        print(f"node model {args.model_cmd}: {err}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m node.models.cli add PATH`` (same as ``node model add PATH``)."""
    p = argparse.ArgumentParser(prog="node")
    add_model_parser(p.add_subparsers(dest="cmd", required=True))
    return run_model_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
