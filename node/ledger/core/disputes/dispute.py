"""Disputes: a requester forces a committee on a receipt instead of leaving it to sampling (pure).

A redundant live session (:mod:`node.inference.redundant`) runs every step on two disjoint routes; when the
outputs of a pair of hops differ, at most one of them is honest and sampling (which checks a receipt with
probability ``p(worker)``, :mod:`node.ledger.core.sampling`) might check neither. The requester then files a
:class:`Dispute` for the receipt of each hop: the ledger records it (table ``disputes``: receipt id -> the height
of the block that included the dispute) and, at the end of the next block, draws the receipt's committee with
that block's hash as the beacon exactly as for a sampled receipt (sampling probability 1). Votes, escalation and
settlement are then those of any sampled receipt (:mod:`node.ledger.core.state`): the honest worker is paid, the
cheat is slashed and the requester refunded.

Rules: only the receipt's requester may dispute it; once per receipt (replay-protected by the receipt id, no
nonce, like receipts and votes); only while the receipt waits for settlement (status ``pending``) and before its
challenge window closes (so that the committee is drawn before the receipt could settle unchecked). A receipt
already before a committee (sampled) is refused with that reason: it is being checked anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..kv import Codec
from ..module import Module, ident
from ..status import PENDING, SAMPLED
from ..txbase import Receipt, SingleSigned, _check
from ..view import StateView


@dataclass(frozen=True)
class Dispute(SingleSigned):
    """The requester ``sender`` asks for a committee on receipt ``receipt_id`` (its own, still pending)."""

    chain_id: str
    sender: bytes  # the receipt's requester
    receipt_id: bytes
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/dispute/v1"
    KIND: ClassVar[str] = "dispute"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "receipt_id": "bytes32"}



def apply_dispute(s: StateView, d: Dispute) -> None:
    """Record ``d`` in ``s.tables["disputes"]`` (at the height of the block being applied).

    Raises:
        InvalidTx: unknown receipt, not the receipt's requester, already disputed, the receipt not pending
            (sampled, or final), or its challenge window closed. ``s`` is unchanged then.
    """
    rec = s.receipts.get(d.receipt_id)
    _check(rec is not None, "dispute of an unknown receipt")
    _check(isinstance(rec.receipt, Receipt), "only inference receipts are disputed (training work has its own checks)")
    _check(rec.receipt.requester == d.sender, "only the receipt's requester may dispute it")
    _check(d.receipt_id not in s.tables["disputes"], "receipt already disputed (counted once)")
    _check(rec.status == PENDING, f"receipt is {rec.status}: "
           + ("already before a committee" if rec.status == SAMPLED else "final, nothing to dispute"))
    height = s.height + 1
    _check(height < rec.height + s.params.challenge_window,
           f"the receipt's challenge window closed at height {rec.height + s.params.challenge_window}")
    s.tables["disputes"][d.receipt_id] = height


def take_dispute(s: StateView, receipt_id: bytes, height: int) -> bool:
    """End of block ``height``: True (and the dispute row removed) when ``receipt_id`` was disputed in an earlier
    block, so its committee is drawn now with this block's hash as the beacon. A dispute included in this very
    block waits one block: its beacon is a hash nobody knew when the dispute was sent."""
    disputes = s.tables["disputes"]
    at = disputes.get(receipt_id)
    if at is None or at >= height:
        return False
    disputes.pop(receipt_id, None)
    return True


MODULE = Module("disputes", txs=(Dispute,), maps={"disputes": Codec(ident, int)},  # receipt id -> height
                store_keys={"disputes": b"z"}, work_txs=(Dispute,), on_apply=apply_dispute, on_force=take_dispute)


__all__ = ["Dispute", "apply_dispute", "take_dispute"]
