"""The marketplace's record (:class:`node.duty.capability.Capability`): fine-tune jobs in a node.

Its ledger module is :data:`node.ledger.core.jobs.MODULE`; in a node it runs :class:`~node.market.worker.JobWorker`
(with ``--accept-jobs``), checks training receipts with :class:`~node.market.check.TrainingCheck`, serves
``/v1/jobs`` (:mod:`node.market.api`) and adds ``node job`` (:mod:`node.market.cli`). The worker, the check and the
router are imported when a node is built, not when ``node --help`` runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..duty.argtypes import positive
from ..duty.capability import Built, Capability, Command, StartOptions, settings_of
from ..duty.parts import NodeParts
from ..duty.seams import ReceiptChecker
from ..ledger.core import jobs
from ..ledger.core.txbase import Tx
from .cli import add_job_parser, run_job_command
from .settings import TRAIN_FAULT_HELP, TRAIN_FAULTS, MarketSettings

if TYPE_CHECKING:
    from fastapi import APIRouter


def _flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--accept-jobs", action="store_true",
                   help="take fine-tune jobs from the marketplace for credits (needs a bond)")
    s.add_argument("--job-capacity", type=positive, default=1, metavar="N",
                   help="with --accept-jobs: hold at most N jobs at once, trained side by side (default: "
                        "%(default)s). The ledger also needs the bond to cover the start penalty of every job held "
                        "before its first segment")


def _settings(args: argparse.Namespace) -> MarketSettings:
    return MarketSettings(accept_jobs=bool(args.accept_jobs), job_capacity=int(args.job_capacity))


def _build(parts: NodeParts) -> Built:
    from .worker import JobWorker  # local: the worker's training imports load only in a node, not for node --help

    worker = JobWorker.from_parts(parts, settings_of(parts.config, MarketSettings))
    return Built(services=(worker,) if worker is not None else ())


def _checkers() -> Mapping[type[Tx], ReceiptChecker]:
    from .check import TrainingCheck  # local: as _build's import

    return TrainingCheck().checkers()


def _router() -> APIRouter:
    from .api import router  # local: FastAPI loads only in a node or an app, not for node --help

    return router


CAPABILITY = Capability(
    name="market",
    ledger=(jobs.MODULE,),
    build=_build,
    checkers=_checkers,
    router=_router,
    commands=(Command("job", add_job_parser, run_job_command),),
    settings=MarketSettings,
    start=StartOptions(add=_flags, settings=_settings),
    faults=TRAIN_FAULTS,
    fault_help=TRAIN_FAULT_HELP,
)

__all__ = ["CAPABILITY", "MarketSettings"]
