"""The requester's disputes, a capability: a requester that catches a receipt it paid for as wrong (a redundant
session whose two routes disagree, :mod:`node.inference.redundant`) puts it before a committee.

* :mod:`~node.disputes.duty` -- :class:`~node.disputes.duty.DisputeDuty`: a plain receipt's
  :class:`~node.ledger.core.disputes.Dispute` at once; a tab receipt's :class:`~node.ledger.core.tabs.TabDispute`
  once the worker's epoch batch that redeems it is on the ledger (a duty run at each block).
* :mod:`~node.disputes.capability` -- its record (:data:`node.capabilities.CAPABILITIES`).

The ledger's half is :mod:`node.ledger.core.disputes` (and, for tab receipts, the tabs module's ``TabDispute``).
"""
