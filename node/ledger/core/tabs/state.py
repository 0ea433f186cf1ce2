"""The ledger records of tabs and epoch batches (values only; the rules are :mod:`.rules`).

Tables (declared by the module, :mod:`node.ledger.core.tabs`): ``tabs`` (tab id -> :class:`Tab`),
``settlements`` (batch key -> :class:`Settlement`, pruned when the batch is final), ``tab_reveals`` (revealed
receipt id -> batch key, while its committee decides), ``tab_disputes`` (disputed receipt id ->
:class:`DisputeHold`, while its committee decides), ``tab_due`` (height -> the batch and tab keys due at its
end) and ``worker_batches`` (worker -> its batches not final and the epoch of its last batch: a later batch must
name a later epoch, also once the earlier is pruned). Amounts in base units, heights in blocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class Tab:
    """A requester's lock for one worker. ``locked`` is still the requester's (held in its account's escrow);
    ``redeemed`` is the newest redeemed voucher's cumulative amount and ``nonce`` its tab nonce; ``close_at`` is 0
    while open, else the height whose end returns ``locked`` to the requester."""

    requester: bytes
    worker: bytes
    locked: int
    redeemed: int = 0
    nonce: int = 0
    close_at: int = 0


class SettlementStatus(str, enum.Enum):
    """Where an epoch batch not yet final is. A final one (paid, forfeited or refuted) leaves the state."""

    DRAWING = "drawing"  # included; its sample is drawn with the hash of a later block
    REVEALING = "revealing"  # drawn; the worker reveals each drawn receipt before ``due``
    CHECKING = "checking"  # every drawn receipt revealed; committees vote on them
    WINDOW = "window"  # every verdict in, none invalid; spendable at the end of block ``due``


@dataclass(frozen=True)
class Settlement:
    """One worker's epoch batch: what it committed to (``root`` over ``count`` receipt ids, ``work``), what moved
    from its tabs to it as pending (``amount``, per tab in ``payments``), and its audit: the drawn leaf indices
    (``draw``), the ids revealed for them (``revealed``, in draw order, ``b""`` while missing), how many of them
    have a verdict (``decided``; the first invalid one refutes the batch at once), and ``due`` (the reveal
    deadline, then the end of the settle window)."""

    worker: bytes
    epoch: int
    root: bytes
    count: int
    work: int
    amount: int
    # (tab id, requester, base units moved to pending, first and last tab nonce the voucher redeemed)
    payments: tuple[tuple[bytes, bytes, int, int, int], ...]
    height: int  # the block that included it
    status: SettlementStatus = SettlementStatus.DRAWING
    draw: tuple[int, ...] = ()
    revealed: tuple[bytes, ...] = ()
    decided: int = 0
    due: int = 0
    disputes: int = 0  # requesters' disputes of its receipts still before a committee (it is not paid while any is)


@dataclass(frozen=True)
class DisputeHold:
    """A requester's dispute of a tab receipt (table ``tab_disputes``, receipt id -> this, until its verdict): the
    batch that redeemed the receipt, the requester, and its ``deposit`` (base units, in the requester's escrow:
    it pays the committee when the receipt is valid, and returns otherwise)."""

    batch_key: bytes
    requester: bytes
    deposit: int


__all__ = ["DisputeHold", "Settlement", "SettlementStatus", "Tab"]
