"""A node's memory budget (``node start --max-memory GIB``) and what uses it (issue 36).

Sizes are the weights as a node holds them at run time: float32 (a GGUF-stored block is dequantized at load; an
int8 model's blocks count as float32 too, an upper bound). They come from the model's config alone — one decoder
block built on the ``meta`` device, its parameters counted — so nothing is loaded to size it.

The budget is split, in this order: the node's own span, its client head when it builds one at start (a server
builds it only at its first generation: ``--lazy-head``, the default with ``--span``), a fixed reserve for
activations, KV caches and the interpreter (:data:`RESERVE`), and what is left for committee duty. A member
re-executes a span it does not serve whole when the span fits that share, block by block from disk when one
block fits (:class:`~node.compute.offload.StreamedSpan`), and abstains otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .model import Manifest, load_manifest, load_span_config

RESERVE = 512 << 20  # bytes kept outside the weights: the interpreter, torch, activations and KV caches (a node
# process with torch, transformers and libp2p loaded is about 450 MiB resident before any weights)
GiB = 1 << 30


class BudgetError(ValueError):
    """The budget cannot hold what the node must hold; the message says what and how much."""


def block_bytes(model_dir: Path) -> int:
    """Float32 bytes of one decoder block of the model in ``model_dir`` (the largest, for mixed layer types).

    Raises:
        FileNotFoundError: no config.  node.compute.arch.UnsupportedArchitecture: an architecture Tally does not run.
    """
    # local: torch and transformers (~4 s); sizing happens where a node will load weights anyway
    import torch

    from .arch import architecture  # local: it imports transformers (see above)

    cfg = load_span_config(model_dir)
    cfg.num_hidden_layers = 1
    cfg.vocab_size = 1
    cfg.pad_token_id = None
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types[:1])
    with torch.device("meta"):
        net = architecture(cfg).base_cls(cfg)
    return int(4 * sum(p.numel() for p in net.layers[0].parameters()))


def head_bytes(manifest: Manifest) -> int:
    """Float32 bytes of a client head: embedding and LM head (vocab × hidden each) and the final norm."""
    return 4 * (2 * manifest.vocab_size * manifest.hidden_size + manifest.hidden_size)


@dataclass(frozen=True)
class MemoryBudget:
    """How a node's ``total`` bytes are used (see the module docstring). ``span`` and ``head`` are what the node
    holds for itself; :attr:`committee` is what is left for re-executing other servers' spans."""

    total: int
    block: int  # float32 bytes of one block of the node's model
    span: int
    head: int
    reserve: int = RESERVE

    @property
    def committee(self) -> int:
        """Bytes for committee duty (0 when nothing is left)."""
        return max(0, self.total - self.span - self.head - self.reserve)

    def view(self) -> dict[str, int]:
        """The budget as ``/v1/status`` shows it (bytes)."""
        return {"total": self.total, "span": self.span, "head": self.head, "reserve": self.reserve,
                "committee": self.committee, "block": self.block}


def plan_budget(total: int, model_dir: Path, span: tuple[int, int] | None, warm_head: bool) -> MemoryBudget:
    """The budget of a node holding ``span`` (blocks ``[start, end)``, or none) of ``model_dir`` and, when
    ``warm_head``, its client head, in ``total`` bytes.

    Raises:
        BudgetError: the span, the head and the reserve do not fit in ``total``.
    """
    manifest = load_manifest(model_dir)
    block = block_bytes(model_dir)
    held = 0 if span is None else block * (span[1] - span[0])
    head = head_bytes(manifest) if warm_head else 0
    b = MemoryBudget(total=total, block=block, span=held, head=head)
    need = b.span + b.head + b.reserve
    if need > total:
        what = [f"its span {held / GiB:.2f} GiB ({span[1] - span[0]} blocks of {block / GiB:.2f})"] if span else []
        what += [f"its client head {head / GiB:.2f} GiB (--lazy-head leaves it for the first generation)"] \
            if head else []
        raise BudgetError(f"--max-memory {total / GiB:.2f} GiB cannot hold {' + '.join(what + [''])}"
                          f"a reserve of {b.reserve / GiB:.2f} GiB: {need / GiB:.2f} GiB in all. Serve fewer blocks "
                          f"(--span) or raise --max-memory")
    return b
