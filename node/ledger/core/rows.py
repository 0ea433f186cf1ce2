"""The core's own state rows: an account (:class:`Account`) and a receipt's ledger record (:class:`ReceiptRecord`).

Below every capability module and the state: the narrow state view (:mod:`node.ledger.core.view`) names them,
and :mod:`node.ledger.core.records` stores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .status import PENDING
from .txbase import Receipt


@dataclass(frozen=True)
class Account:
    """Per-account state in base units. ``valid_run``: consecutive valid verdicts (adaptive sampling)."""

    balance: int = 0
    bond: int = 0
    escrow: int = 0
    nonce: int = 0
    valid_run: int = 0
    slashed: int = 0

    def to_list(self) -> list[int]:
        return [self.balance, self.bond, self.escrow, self.nonce, self.valid_run, self.slashed]


@dataclass(frozen=True)
class ReceiptRecord:
    """Ledger summary of a receipt (no tensors) and its verification status."""

    receipt: Receipt
    height: int
    status: str = PENDING
    p_ppm: int = 0
    round: int = 0
    round_height: int = 0
    committee: tuple[bytes, ...] = ()
    votes: tuple[tuple[bytes, int, int, int], ...] = ()  # (voter, round, verdict, distance_ppm)
    final_height: int = 0
    payouts: tuple[tuple[bytes, int], ...] = ()  # (account, base units), incl. the requester's refund
    slashed: int = 0

    def round_votes(self) -> dict[bytes, int]:
        return {v: verdict for v, r, verdict, _ in self.votes if r == self.round}

    def to_dict(self) -> dict[Any, Any]:
        r = self.receipt
        return {"id": r.id, "receipt": r.to_wire(), "height": self.height, "status": self.status,
                "p_ppm": self.p_ppm, "round": self.round, "committee": list(self.committee),
                "votes": [list(v) for v in self.votes], "final_height": self.final_height,
                "payouts": [list(p) for p in self.payouts], "slashed": self.slashed}


__all__ = ["Account", "ReceiptRecord"]
