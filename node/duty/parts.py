"""The node's parts as one typed bundle (issue 26): what a capability is built from.

:class:`node.runtime.Node` builds the services of one node (its key, the ledger, the libp2p host, the blob store,
the torch executor, its settings) and hands them to each capability as one frozen :class:`NodeParts`, instead of
passing the node itself, untyped. Each field is typed by its role, declared once in :mod:`node.duty.seams`
(``Ledger``, ``Host``, ``Executor``) and imported by every capability that receives it, as Cosmos SDK modules name
their ``expected_keepers``; the settings by :class:`Settings`. The node passes
:class:`node.ledger.service.LedgerService`, :class:`node.p2p.host.P2PHost`,
:class:`node.compute.executor.TorchExecutor` and ``node.config.NodeConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..blobs import BlobStore
from ..identity import Identity
from ..p2p.budget import ReplyBudget
from .seams import Executor, Host, Ledger


class Settings(Protocol):
    """What the capabilities read of the node's base settings (``node.config.NodeConfig``); each reads its own
    part with :func:`node.duty.capability.settings_of`."""

    @property
    def data_dir(self) -> Path: ...  # the node's data dir (capabilities keep their files under it)

    @property
    def model_dir(self) -> Path: ...  # this node's model

    @property
    def device(self) -> str: ...  # torch device ("cpu", "cuda:0")

    @property
    def fault(self) -> str | None: ...  # a test/devnet cheat; each capability takes the names it knows


class Service(Protocol):
    """A capability's long-running part: ``run()`` until cancelled (started in the node's nursery)."""

    async def run(self) -> None: ...


@dataclass(frozen=True)
class NodeParts:
    """The services a capability is built from (module docstring).

    Attributes:
        ident: the node's key. config: its settings. ledger, host, blobs, executor: its services.
        model_id: the Merkle root of this node's model (``config.model_dir``'s manifest).
        reply_budget: the bytes of bulk replies (blobs, blocks, batch content) the node streams at once, per peer
            and in all (:class:`node.p2p.budget.ReplyBudget`), shared by every protocol that streams from disk.
    """

    ident: Identity
    config: Settings
    ledger: Ledger
    host: Host
    blobs: BlobStore
    executor: Executor
    model_id: bytes
    reply_budget: ReplyBudget


__all__ = ["Executor", "Host", "Ledger", "NodeParts", "Service", "Settings"]  # the roles: node.duty.seams
