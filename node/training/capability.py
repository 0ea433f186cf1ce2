"""Training runs' record (:class:`node.duty.capability.Capability`): DiLoCo runs in a node.

Its ledger module is :data:`node.ledger.core.runs.MODULE`; in a node it runs
:class:`~node.training.worker.RunWorker` (idle until this node joins a run), checks round receipts and aggregates
with :class:`~node.training.replay.RunChecks`, serves ``/v1/runs`` (:mod:`node.training.api`) and adds ``node run``
(:mod:`node.training.cli`). The worker, the checks and the router are imported when a node is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..duty.capability import Built, Capability, Command
from ..duty.parts import NodeParts
from ..duty.seams import ReceiptChecker
from ..ledger.core import runs
from ..ledger.core.txbase import Tx
from .cli import add_run_parser, run_run_command
from .faults import RUN_FAULT_HELP, RUN_FAULTS

if TYPE_CHECKING:
    from fastapi import APIRouter


def _build(parts: NodeParts) -> Built:
    from .worker import RunWorker  # local: the worker's imports load only in a node, not for node --help

    return Built(services=(RunWorker.from_parts(parts),))


def _checkers() -> Mapping[type[Tx], ReceiptChecker]:
    from .replay import RunChecks  # local: as _build's import

    return RunChecks().checkers()


def _router() -> APIRouter:
    from .api import router  # local: FastAPI loads only in a node or an app, not for node --help

    return router


CAPABILITY = Capability(
    name="training",
    ledger=(runs.MODULE,),
    build=_build,
    checkers=_checkers,
    router=_router,
    commands=(Command("run", add_run_parser, run_run_command),),
    faults=RUN_FAULTS,
    fault_help=RUN_FAULT_HELP,
)

__all__ = ["CAPABILITY"]
