"""Verification status of a receipt on the ledger (:class:`node.ledger.core.state.ReceiptRecord`).

``pending`` (included; not sampled, or sampling not drawn yet) → ``sampled`` (a committee is replaying it) →
one of the final statuses: ``valid`` / ``invalid`` (a committee quorum), ``settled`` (not sampled: paid after the
challenge window), ``unverified`` (sampled, no quorum after every escalation: paid, as abstention never
penalises a worker).
"""


import enum


class ReceiptStatus(enum.StrEnum):
    """A receipt's verification status on the ledger. A ``StrEnum``: stored, hashed and served as its value (the
    lowercase word), equal to that string, so records written before it was an enum read the same."""

    PENDING = "pending"
    SAMPLED = "sampled"
    VALID = "valid"
    INVALID = "invalid"
    SETTLED = "settled"
    UNVERIFIED = "unverified"

    @property
    def final(self) -> bool:
        """Whether no later block changes it (valid, invalid, settled, unverified)."""
        return self in FINAL


PENDING, SAMPLED, VALID_S, INVALID_S, SETTLED, UNVERIFIED = (
    ReceiptStatus.PENDING, ReceiptStatus.SAMPLED, ReceiptStatus.VALID, ReceiptStatus.INVALID, ReceiptStatus.SETTLED,
    ReceiptStatus.UNVERIFIED)
FINAL: frozenset[str] = frozenset({VALID_S, INVALID_S, SETTLED, UNVERIFIED})
