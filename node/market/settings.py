"""The marketplace's part of a node's settings (a base of ``node.config.NodeConfig``; ``node start`` flags in
:mod:`node.market.capability`)."""

from __future__ import annotations

from dataclasses import dataclass

TRAIN_FAULTS = ("skip-steps", "other-data", "fake-adapter", "diverge")  # the job worker's cheats (compute.train)
TRAIN_FAULT_HELP = ("Training (with --accept-jobs): 'skip-steps' trains one step fewer per segment than claimed, "
                    "'other-data' trains on other batches than committed, 'fake-adapter' reports a state it never "
                    "trained, 'diverge' blows its adapter up (NaN loss).")


@dataclass
class MarketSettings:
    """Take fine-tune jobs from the marketplace (``--accept-jobs``; needs a bond), and hold at most
    ``job_capacity`` at once (``--job-capacity``)."""

    accept_jobs: bool = False
    job_capacity: int = 1


__all__ = ["TRAIN_FAULTS", "TRAIN_FAULT_HELP", "MarketSettings"]
