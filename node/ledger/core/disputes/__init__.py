"""Disputes, a ledger module (:mod:`node.ledger.core.modules`): a requester forces a committee on a receipt.

* :mod:`~node.ledger.core.disputes.dispute` -- the :class:`~node.ledger.core.disputes.dispute.Dispute` kind, its
  rules (:func:`~node.ledger.core.disputes.dispute.apply_dispute`,
  :func:`~node.ledger.core.disputes.dispute.take_dispute`) and the module object ``MODULE``: the kind, the
  ``disputes`` table, and ``forces_check`` (a disputed receipt gets a committee at the end of the next block).

The module is registered by one line of :data:`node.ledger.core.modules.MODULES`; nothing else in the core
names it.
"""

from .dispute import MODULE, Dispute, apply_dispute, take_dispute

__all__ = ["MODULE", "Dispute", "apply_dispute", "take_dispute"]
