"""Verification status of a receipt on the ledger (:class:`node.ledger.core.state.ReceiptRecord`).

``pending`` (included; not sampled, or sampling not drawn yet) → ``sampled`` (a committee is replaying it) →
one of the final statuses: ``valid`` / ``invalid`` (a committee quorum), ``settled`` (not sampled: paid after the
challenge window), ``unverified`` (sampled, no quorum after every escalation: paid, as abstention never
penalises a worker).
"""

PENDING, SAMPLED, VALID_S, INVALID_S, SETTLED, UNVERIFIED = (
    "pending", "sampled", "valid", "invalid", "settled", "unverified")
FINAL = frozenset({VALID_S, INVALID_S, SETTLED, UNVERIFIED})
