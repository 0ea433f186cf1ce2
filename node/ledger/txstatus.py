"""What a node can say about one transaction id: in a stored block, queued (and why it is not in a block yet),
dropped or refused (and why), or unknown. Built by :meth:`node.ledger.service.LedgerService.tx_status` from the
store and the mempool (:meth:`node.ledger.mempool.Mempool.status`); answered by ``GET /v1/txs/{id}/status``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TxState(str, enum.Enum):
    """Where a transaction stands on one node."""

    INCLUDED = "included"  # in a stored (finalized) block
    PENDING = "pending"  # queued in this node's mempool
    DROPPED = "dropped"  # refused or dropped by this node's mempool (the reason says which and why)
    UNKNOWN = "unknown"  # never seen here, or forgotten (the memory of reasons is bounded)


@dataclass(frozen=True)
class TxStatus:
    """One node's answer about a transaction.

    Attributes:
        state: :class:`TxState`.
        reason: why it is pending (ready and waiting for a block, or waiting for a missing nonce) or why it was
            dropped; empty when included or unknown.
        pending_s: seconds since this node admitted it (pending only; 0 otherwise).
        height: the block that holds it (included), or the head height when it was admitted (pending); 0 else.
        missing_nonce: for a transaction queued behind a nonce gap, the sender's nonce that has not arrived.
        expires_in_blocks: for such a gapped transaction, the blocks it may still wait before it is dropped.
        resent: times this node re-sent it to its peers (re-gossip and direct submit; local transactions only).
    """

    state: TxState
    reason: str = ""
    pending_s: float = 0.0
    height: int = 0
    missing_nonce: int | None = None
    expires_in_blocks: int | None = None
    resent: int = 0

    def describe(self) -> str:
        """One line for a person: ``pending for 12 s: ...``, ``dropped: ...``, ``included at height 7``."""
        if self.state is TxState.INCLUDED:
            return f"included at height {self.height}"
        if self.state is TxState.PENDING:
            return f"pending for {self.pending_s:.0f} s: {self.reason}"
        if self.state is TxState.DROPPED:
            return f"dropped: {self.reason}"
        return "unknown to this node (never seen, or forgotten)"


__all__ = ["TxState", "TxStatus"]
