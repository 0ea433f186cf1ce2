"""Settlement by tabs' record (:class:`node.duty.capability.Capability`): tabs and epoch batches in a node.

Its ledger module is :data:`node.ledger.core.tabs.MODULE`. On a chain with tabs (genesis ``epoch_blocks``) a node
keeps, as a worker, the receipts it holds until their epoch batch is final (:class:`~node.settle.book.EpochBook`,
checked for each session by :class:`~node.settle.tabs.TabGate`) and commits to them once per epoch
(:class:`~node.settle.duty.SettleDuty`); as a requester, its tabs (:class:`~node.settle.tabs.TabBook`; a tab
receipt's dispute is the disputes capability's, :mod:`node.disputes`). The span server and the route client reach
the gate, the book and the tabs through ``Node.service``. It serves the tabs' and settlements' API
(:mod:`node.settle.api`); it adds no command of its own (``node wallet tabs`` reads that API). On a chain without
tabs it builds nothing.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..duty.argtypes import credits
from ..duty.capability import Built, Capability, StartOptions, settings_of
from ..duty.parts import NodeParts
from ..duty.runner import DutyRunner
from ..ledger.core import tabs
from .book import EpochBook
from .duty import SettleDuty
from .settings import SettleSettings
from .tabs import TabBook, TabGate

if TYPE_CHECKING:
    from fastapi import APIRouter


def _flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--tab-lock", type=credits, default=SettleSettings.tab_lock, metavar="CREDITS",
                   help="on a chain with tabs: the credits this node locks in each tab it opens to pay a server "
                        "(at least one session's most expensive outcome; unspent credits return after the tab "
                        "closes; default: 10)")


def _settings(args: argparse.Namespace) -> SettleSettings:
    """Raises ValueError: a lock of 0 credits (no session could be paid through it)."""
    if args.tab_lock <= 0:
        raise ValueError("--tab-lock must be more than 0 credits")
    return SettleSettings(tab_lock=int(args.tab_lock))


def _build(parts: NodeParts) -> Built:
    ledger, cfg = parts.ledger, parts.config
    if not ledger.genesis.params.epoch_blocks:
        return Built()
    book = EpochBook(cfg.data_dir / "settle", ledger.genesis.domain)  # a LevelDB: closed with the node
    gate = TabGate(lambda: ledger.state, book, parts.ident.account)
    tabs_ = TabBook(ledger, parts.ident, cfg.data_dir / "tabs.json", settings_of(cfg, SettleSettings).tab_lock)
    return Built(services=(DutyRunner(SettleDuty(ledger, parts.ident, book, parts.blobs), ledger),),
                 parts=(book, gate, tabs_), close=book.close)


def _router() -> APIRouter:
    from .api import router  # local: FastAPI loads only in a node or an app, not for node --help

    return router


CAPABILITY = Capability(
    name="settle",
    ledger=(tabs.MODULE,),
    build=_build,
    router=_router,
    settings=SettleSettings,
    start=StartOptions(add=_flags, settings=_settings),
)

__all__ = ["CAPABILITY"]
