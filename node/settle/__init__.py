"""Settlement by tabs on the worker's side (issue 37): the receipts it holds (:mod:`node.settle.book`) and the duty
that commits to them once per epoch and reveals what the ledger draws (:mod:`node.settle.duty`)."""
