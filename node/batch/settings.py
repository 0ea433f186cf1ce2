"""Batch jobs' part of a node's settings (a base of ``node.config.NodeConfig``; ``node start`` flags in
:mod:`node.batch.capability`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BatchSettings:
    """Offer to be drawn for batch items (``--accept-batches``; needs a bond) at ``batch_floor`` base units per
    token at least (``--batch-floor``; None: the genesis floor)."""

    accept_batches: bool = False
    batch_floor: int | None = None


__all__ = ["BatchSettings"]
