"""The disputes' record (:class:`node.duty.capability.Capability`): a requester's disputes in a node.

Its ledger module is :data:`node.ledger.core.disputes.MODULE` (a tab receipt's dispute is the tabs module's
``TabDispute``, judged against the worker's epoch batch). In a node it runs :class:`~node.disputes.duty.DisputeDuty`
(idle while nothing is queued), which the route client reaches through ``Node.service`` to dispute the receipts its
redundant sessions caught. No router, command or settings of its own.
"""

from __future__ import annotations

from ..duty.capability import Built, Capability
from ..duty.parts import NodeParts
from ..duty.runner import DutyRunner
from ..ledger.core import disputes
from .duty import DisputeDuty


def _build(parts: NodeParts) -> Built:
    duty = DisputeDuty(parts.ledger, parts.ident)
    return Built(services=(DutyRunner(duty, parts.ledger),), parts=(duty,))


CAPABILITY = Capability(name="disputes", ledger=(disputes.MODULE,), build=_build)

__all__ = ["CAPABILITY"]
