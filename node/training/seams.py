"""What the training package needs of the node's other services, declared here as Protocols by their consumer (issue
26; as :mod:`node.batch.worker` does, and as Cosmos SDK modules name their ``expected_keepers``): the torch executor,
the host that blobs are fetched over, and the ledger. The node passes its own services
(:class:`node.compute.executor.TorchExecutor`, :class:`node.p2p.host.P2PHost`,
:class:`node.ledger.service.LedgerService`); tests may pass anything with these members.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import trio

from ..ledger.core.state import State
from ..ledger.core.tx import Tx

T = TypeVar("T")


class Executor(Protocol):
    """The node's torch executor: ``fn(*args)`` on its worker thread (one call at a time), awaited."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


class BlobHost(Protocol):
    """What :func:`node.blobs.fetch_blob` needs of the host: one request and its reply, within ``timeout``
    seconds, the reply read up to ``max_message`` bytes."""

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int = ...) -> dict[str, Any]: ...


class LedgerReader(Protocol):
    """The ledger as a committee's checks read it: the current state, and an event set at the next block."""

    @property
    def state(self) -> State: ...

    @property
    def new_block(self) -> trio.Event: ...


class RunLedger(LedgerReader, Protocol):
    """The ledger as a run's worker and sponsor use it: also the signing domain, nonces and submission."""

    @property
    def chain_id(self) -> str: ...

    def next_nonce(self, account: bytes) -> int: ...

    async def submit(self, tx: Tx) -> bytes: ...


__all__ = ["BlobHost", "Executor", "LedgerReader", "RunLedger"]
