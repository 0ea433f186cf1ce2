"""Settlement by tabs and epoch batches, a capability (issue 37).

* The worker's side: the receipts it holds until their epoch batch is final (:mod:`node.settle.book`), the gate
  that checks a session's tab at open (:class:`node.settle.tabs.TabGate`) and the duty that commits to the
  receipts once per epoch and reveals what the ledger draws (:mod:`node.settle.duty`).
* The requester's side: its tabs, one per worker (:class:`node.settle.tabs.TabBook`).
* :mod:`~node.settle.api` -- the tabs' and settlements' API and views; :mod:`~node.settle.settings` -- its part
  of the node's settings (``--tab-lock``); :mod:`~node.settle.capability` -- its record.

A tab receipt's dispute is the disputes capability's (:mod:`node.disputes`). The ledger's half is
:mod:`node.ledger.core.tabs`.
"""
