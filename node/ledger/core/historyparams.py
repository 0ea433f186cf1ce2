"""The genesis parameters of the receipt history (:mod:`node.ledger.core.history`)."""

from __future__ import annotations

from dataclasses import dataclass

from .params import ParamPart


@dataclass(frozen=True)
class HistoryParams:
    """History that ends: a final inference receipt leaves the state ``retention_blocks`` blocks after it became
    final (and not before it is too old to be replayed), its summary kept in the state's RFC 9162 history log. 0:
    receipts stay forever, as before; 0 is left out of the genesis hash and document."""

    retention_blocks: int = 0


HISTORY_PART = ParamPart(HistoryParams, frozenset({"retention_blocks"}))

__all__ = ["HISTORY_PART", "HistoryParams"]
