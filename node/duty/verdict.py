"""What a committee check of one receipt returns (issue 38): :class:`CheckResult`, a verdict and its distance.

Every capability's :class:`~node.duty.seams.ReceiptChecker` (``node.market.check.TrainingCheck``,
``node.training.replay.RunChecks``, the member's own inference check) returns one; the committee member signs it
as a :class:`~node.ledger.core.tx.Vote` (the distance in parts per million, ``inf`` saturated:
:func:`node.compute.compare.to_ppm`). It lives here, below the capabilities, so that each can build one without
importing another or :mod:`node.verify`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..ledger.core.txbase import Verdict

__all__ = ["CheckResult"]


class CheckResult(NamedTuple):
    """A committee check's outcome: ``verdict`` (VALID / INVALID / ABSTAIN) and ``distance``, in the check's own
    unit (relative L2 of outputs or of training states; 0 for an exact match), ``inf`` when nothing was measured
    (an abstention, or a check that failed before comparing anything). A tuple, so ``verdict, distance = r``
    reads it too."""

    verdict: Verdict
    distance: float = math.inf
