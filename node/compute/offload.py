"""Re-executing a span block by block from disk, holding one block at a time (issue 36: committees within a budget).

As offloading runtimes do (FlexGen, Sheng et al. 2023, arXiv:2303.06865; accelerate's disk offload), the weights
of a span too large for a member's memory budget are loaded one block at a time: block ``i`` is read and checked
against its manifest hash, run over every position, and dropped before block ``i + 1`` is read. Only a prefill is
offered — a committee re-executes a receipt's whole session at once — and it equals
:meth:`node.compute.span.SpanModel.prefill` of the whole span bit for bit: each block is a one-block
:class:`~node.compute.span.SpanModel` fed the previous block's output, the same operations on the same shapes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .model import load_manifest
from .span import SpanModel


class StreamedSpan:
    """Blocks ``[start, end)`` of ``model_dir``, run one block in memory at a time (see the module docstring).

    Raises (constructor):
        FileNotFoundError: no manifest.  ValueError: bad bounds.
    """

    def __init__(self, model_dir: Path, start: int, end: int, device: str = "cpu"):
        self.model_dir, self.device = Path(model_dir), device
        self.manifest = load_manifest(self.model_dir)
        if not (0 <= start < end <= self.manifest.num_blocks):
            raise ValueError(f"span [{start}, {end}) is not a non-empty range inside [0, {self.manifest.num_blocks})")
        self.start, self.end = start, end
        self.model_id = self.manifest.model_id
        self.blocks_loaded = 0  # how many block loads the prefills made (tests, logs)

    def __repr__(self) -> str:
        return f"StreamedSpan({self.manifest.name}, [{self.start}, {self.end}))"

    def prefill(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every position of ``hidden`` (float32 ``(batch, tokens, hidden_size)``) through the span, one block in
        memory at a time; returns the same shape.

        Raises:
            FileNotFoundError / ValueError: a block file is missing or does not match its hash; as
                :meth:`SpanModel.prefill` for bad input.
        """
        for i in range(self.start, self.end):
            block = SpanModel(self.model_dir, i, i + 1, device=self.device)
            self.blocks_loaded += 1
            hidden = block.prefill(hidden)
            del block  # dropped before the next block is read
        return hidden
