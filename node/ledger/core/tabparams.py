"""The genesis parameters of settlement by tabs and epoch batches (:mod:`node.ledger.core.tabs`, issue 37)."""

from __future__ import annotations

from dataclasses import dataclass

from .params import GenesisError, ParamPart


@dataclass(frozen=True)
class TabParams:
    """``epoch_blocks`` blocks per epoch (0: no tabs on this chain); ``batch_samples`` receipts drawn from each
    epoch batch (scaled by the worker's record as p is); ``reveal_window`` blocks to reveal them after the draw;
    ``settle_window`` blocks after the last verdict before a batch's pending credits are spendable;
    ``tab_close_delay`` blocks from a tab's close to its unspent lock's return. Each is left out of the genesis
    hash and document when 0."""

    epoch_blocks: int = 0
    batch_samples: int = 0
    reveal_window: int = 0
    settle_window: int = 0
    tab_close_delay: int = 0


def check_tab_params(p: TabParams) -> None:
    """Raises :class:`GenesisError` when, with ``epoch_blocks`` set, a window is out of its range."""
    if p.epoch_blocks and not (2 <= p.batch_samples <= 1_000_000 and 1 <= p.reveal_window <= 10_000
                               and 1 <= p.settle_window <= 100_000
                               and p.tab_close_delay >= 2 * p.epoch_blocks + p.reveal_window):
        raise GenesisError("with epoch_blocks set, need 2 <= batch_samples (any m >= 2 makes faking a receipt a "
                           "loss), 1 <= reveal_window <= 10000, 1 <= settle_window <= 100000, and "
                           "tab_close_delay >= 2 × epoch_blocks + reveal_window (a worker can still redeem "
                           "a closing tab's last epoch)")


TAB_PART = ParamPart(TabParams, frozenset({
        "epoch_blocks", "batch_samples", "reveal_window", "settle_window", "tab_close_delay"}), check_tab_params)

__all__ = ["TAB_PART", "TabParams", "check_tab_params"]
