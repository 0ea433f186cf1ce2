"""Typed views of the ledger's receipt kinds: :func:`receipt_view` maps each concrete receipt transaction to the
fields the API and the explorer show of it (:func:`node.api.views.receipt_json`), by ``isinstance`` dispatch, so
each field read is checked against the class that declares it.

The kinds (every transaction a :class:`~node.ledger.core.rows.ReceiptRecord` holds):

* inference: :class:`~node.ledger.core.txbase.Receipt` (paid per session) and
  :class:`~node.ledger.core.tabs.tabtx.TabReceipt` (paid through a tab; its ``price`` is 0): a :class:`Session`;
* training: :class:`~node.ledger.core.jobtx.TrainReceipt` (a fine-tune job's segment: ``job_id``),
  :class:`~node.ledger.core.runtx.RoundReceipt` and :class:`~node.ledger.core.runtx.RoundAggregate` (a run's
  round work and its aggregation).

A new receipt kind is added here; until it is, :func:`receipt_view` raises TypeError for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ledger.core.jobtx import TrainReceipt
from ..ledger.core.runtx import RoundAggregate, RoundReceipt
from ..ledger.core.tabs.tabtx import TabReceipt
from ..ledger.core.txbase import Receipt, Tx

INFERENCE = "inference"
TRAINING = "training"


@dataclass(frozen=True)
class Session:
    """The inference session an inference receipt claims: its id, the model, the blocks ``[span_start, span_end)``
    served, the token positions processed and the ledger height when it opened."""

    session_id: bytes
    model_id: bytes
    span_start: int
    span_end: int
    tokens: int
    opened_height: int

    @property
    def work(self) -> int:
        """Work in token-blocks: ``tokens × (span_end − span_start)``."""
        return self.tokens * (self.span_end - self.span_start)


@dataclass(frozen=True)
class ReceiptView:
    """What every receipt kind shows: its id, ``kind`` (:data:`INFERENCE` or :data:`TRAINING`), the account that
    did the work and the one paying (32-byte accounts), the price in base units; ``session`` for an inference
    receipt, ``job_id`` for a fine-tune job's segment (None otherwise)."""

    id: bytes
    kind: str
    worker: bytes
    requester: bytes
    price: int
    session: Session | None = None
    job_id: bytes | None = None


def receipt_view(r: Tx) -> ReceiptView:
    """The :class:`ReceiptView` of receipt transaction ``r``.

    Raises:
        TypeError: ``r`` is not one of the receipt kinds listed in the module docstring.
    """
    if isinstance(r, (Receipt, TabReceipt)):
        session = Session(r.session_id, r.model_id, r.span_start, r.span_end, r.tokens, r.opened_height)
        return ReceiptView(r.id, INFERENCE, r.worker, r.requester, r.price, session=session)
    if isinstance(r, TrainReceipt):
        return ReceiptView(r.id, TRAINING, r.worker, r.requester, r.price, job_id=r.job_id)
    if isinstance(r, (RoundReceipt, RoundAggregate)):
        return ReceiptView(r.id, TRAINING, r.worker, r.requester, r.price)
    raise TypeError(f"a {type(r).__name__} ({r.KIND}) is not a receipt kind the API knows")
