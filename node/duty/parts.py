"""The node's parts as one typed bundle (issue 26): what a capability is built from.

:class:`node.runtime.Node` builds the services of one node (its key, the ledger, the libp2p host, the blob store,
the torch executor, its settings) and hands them to each capability as one frozen :class:`NodeParts`, instead of
passing the node itself, untyped. Each field is typed with a narrow Protocol declared here, the union of what the
capabilities use of that service (the consumer-declared seams, as Cosmos SDK modules name their
``expected_keepers``): every capability's own Protocol (``node.batch.worker.LedgerView``,
``node.training.seams.RunLedger``, ``node.batch.offer.OfferLedger``, ...) is a subset of the field's, so a bundle
field satisfies it and mypy checks both sides. The node passes :class:`node.ledger.service.LedgerService`,
:class:`node.p2p.host.P2PHost`, :class:`node.compute.executor.TorchExecutor` and ``node.runtime.NodeConfig``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from ..blobs import BlobStore
from ..identity import Identity
from ..ledger.core.block import Block
from ..ledger.core.genesis import Genesis
from ..ledger.core.state import State
from ..ledger.core.tx import Tx

T = TypeVar("T")


class Executor(Protocol):
    """The node's torch executor: ``fn(*args)`` on its worker thread (one call at a time), awaited."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


class Host(Protocol):
    """What the capabilities need of the libp2p host: one request and its reply within ``timeout`` seconds, the
    reply read up to ``max_message`` bytes (:func:`node.blobs.fetch_blob`, :func:`node.batch.content.fetch_content`).

    Raises (``request``): ``PeerUnreachable``, ``RemoteError``, ``StreamClosed``, ``FrameError``,
    ``RequestTimeout`` of :mod:`node.p2p`."""

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int = ...) -> dict[str, Any]: ...


class Ledger(Protocol):
    """What the capabilities need of the ledger service: the current state and genesis, the signing domain
    (``chain_id``), the pending transactions, block listeners (``fn(block, new_state)`` after each stored block)
    and an event set at the next block, nonces, and submitting a transaction (raises ``InvalidTx`` when the
    local node refuses it)."""

    @property
    def state(self) -> State: ...

    @property
    def genesis(self) -> Genesis: ...

    @property
    def chain_id(self) -> str: ...

    @property
    def mempool(self) -> Mapping[bytes, Tx]: ...

    @property
    def new_block(self) -> trio.Event: ...

    def on_block(self, fn: Callable[[Block, State], None]) -> None: ...

    def next_nonce(self, account: bytes) -> int: ...

    async def submit(self, tx: Tx) -> bytes: ...


class Settings(Protocol):
    """What the capabilities read of the node's settings (``node.runtime.NodeConfig``)."""

    @property
    def data_dir(self) -> Path: ...  # the node's data dir (capabilities keep their files under it)

    @property
    def model_dir(self) -> Path: ...  # this node's model

    @property
    def device(self) -> str: ...  # torch device ("cpu", "cuda:0")

    @property
    def fault(self) -> str | None: ...  # a test/devnet cheat; each capability takes the names it knows

    @property
    def accept_jobs(self) -> bool: ...  # take fine-tune jobs (node.market.worker)

    @property
    def job_capacity(self) -> int: ...  # fine-tune jobs held at once

    @property
    def accept_batches(self) -> bool: ...  # keep a batch offer on the ledger (node.batch.offer)

    @property
    def batch_floor(self) -> int | None: ...  # base units per token at least (None: the genesis floor)


class Service(Protocol):
    """A capability's long-running part: ``run()`` until cancelled (started in the node's nursery)."""

    async def run(self) -> None: ...


@dataclass(frozen=True)
class NodeParts:
    """The services a capability is built from (module docstring).

    Attributes:
        ident: the node's key. config: its settings. ledger, host, blobs, executor: its services.
        model_id: the Merkle root of this node's model (``config.model_dir``'s manifest).
    """

    ident: Identity
    config: Settings
    ledger: Ledger
    host: Host
    blobs: BlobStore
    executor: Executor
    model_id: bytes


__all__ = ["Executor", "Host", "Ledger", "NodeParts", "Service", "Settings"]
