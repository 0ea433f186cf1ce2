"""Batch jobs' record (:class:`node.duty.capability.Capability`): batch items checked by majority vote in a node.

Its ledger module is :data:`node.ledger.core.batch.MODULE`; in a node it keeps the item files and results
(:class:`~node.batch.items.ContentStore`, served over ``BATCH_PROTOCOL`` to whoever may read them), runs
:class:`~node.batch.worker.BatchWorker` (idle unless the ledger assigns this bonded node items) and
:class:`~node.batch.offer.OfferKeeper` (the node's offer: ``--accept-batches``, ``--batch-floor``), serves
``/v1/batches`` (:mod:`node.batch.api`) and adds ``node batch`` (:mod:`node.batch.cli`). A batch item's check is the
majority of its replicas on the ledger: no committee checker. The worker, the content handler and the router are
imported when a node is built.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING

from ..duty.argtypes import credits
from ..duty.capability import Built, Capability, Command, StartOptions, settings_of
from ..duty.parts import NodeParts
from ..ledger.core import batch
from ..ledger.core.batchtx import MAX_FLOOR
from .cli import add_batch_parser, run_batch_command
from .settings import BatchSettings

if TYPE_CHECKING:
    from fastapi import APIRouter


def _flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--accept-batches", action="store_true",
                   help="offer to do batch items (generate, score) for credits: publishes a batch offer on the "
                        "ledger, so the ledger may draw this node for batches that pay at least --batch-floor per "
                        "token (needs a bond). Without this flag the node withdraws any offer it made before and is "
                        "drawn for no new batch (items already drawn are still done)")
    s.add_argument("--batch-floor", type=credits, metavar="CREDITS",
                   help="with --accept-batches: the least this node takes per token of batch work, in credits "
                        "(e.g. 0.0001); a score item counts as 256 tokens (default: the chain's genesis floor)")


def _settings(args: argparse.Namespace) -> BatchSettings:
    """Raises ValueError: ``--batch-floor`` without ``--accept-batches``, or above the ledger's largest floor."""
    floor: int | None = args.batch_floor
    if floor is not None and not args.accept_batches:
        raise ValueError("--batch-floor sets the price of --accept-batches; give both")
    if floor is not None and floor > MAX_FLOOR:
        raise ValueError(f"--batch-floor is at most {MAX_FLOOR / 10**9:g} credits per token")
    return BatchSettings(accept_batches=bool(args.accept_batches), batch_floor=floor)


def _build(parts: NodeParts) -> Built:
    from .content import BATCH_PROTOCOL, ContentAccess, content_handler  # local: libp2p streams, in a node only
    from .items import ContentStore  # local: as the line above
    from .offer import OfferKeeper, wanted_offer  # local: as the line above
    from .worker import BatchWorker  # local: as the line above

    mine = settings_of(parts.config, BatchSettings)
    store = ContentStore(parts.config.data_dir)  # batch item files and results, by content hash
    worker = BatchWorker.from_parts(parts, store)  # batch items the ledger assigns
    offers = OfferKeeper(parts.ident, parts.ledger, wanted_offer(mine.accept_batches, mine.batch_floor,
                                                                 parts.ledger.genesis.params.batch_token_floor()))
    handler = partial(content_handler, store, ContentAccess(parts.ledger), parts.reply_budget)
    return Built(services=(worker, offers), handlers={BATCH_PROTOCOL: handler}, parts=(store,))


def _router() -> APIRouter:
    from .api import router  # local: FastAPI loads only in a node or an app, not for node --help

    return router


CAPABILITY = Capability(
    name="batch",
    ledger=(batch.MODULE,),
    build=_build,
    router=_router,
    commands=(Command("batch", add_batch_parser, run_batch_command),),
    settings=BatchSettings,
    start=StartOptions(add=_flags, settings=_settings),
)

__all__ = ["CAPABILITY"]
