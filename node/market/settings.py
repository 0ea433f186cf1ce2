"""The marketplace's part of a node's settings (a base of ``node.config.NodeConfig``; ``node start`` flags in
:mod:`node.market.capability`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MarketSettings:
    """Take fine-tune jobs from the marketplace (``--accept-jobs``; needs a bond), and hold at most
    ``job_capacity`` at once (``--job-capacity``)."""

    accept_jobs: bool = False
    job_capacity: int = 1


__all__ = ["MarketSettings"]
