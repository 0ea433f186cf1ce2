"""Settlement's part of a node's settings (a base of ``node.config.NodeConfig``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SettleSettings:
    """On a chain with tabs (genesis ``epoch_blocks``, issue 37): the base units this node locks in each tab it
    opens to pay a server (at least one session's most expensive outcome)."""

    tab_lock: int = 10 * 10**9


__all__ = ["SettleSettings"]
