"""The ledger's seams, declared once: what the ledger service and its consensus driver need of the libp2p host
(:class:`LedgerHost`, which :class:`node.p2p.host.P2PHost` fits), the streams its request handlers read and write
(:class:`MsgStream`), and what the driver needs of the service that runs it (:class:`ConsensusLedger`, which
:class:`node.ledger.service.LedgerService` fits; the service imports the driver, so the driver names the service
only through this Protocol).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..identity import Identity
from ..p2p.framing import ByteReader, ByteWriter
from .core.block import Block
from .core.state import State
from .core.tx import Tx
from .genesis import Genesis
from .mempool import Mempool
from .store import LedgerStore

if TYPE_CHECKING:  # (annotations only: node.p2p.gossip loads libp2p's pubsub)
    from ..p2p.gossip import GossipHandler, GossipValidator


class MsgStream(ByteReader, ByteWriter, Protocol):
    """A request stream a handler reads one message from and writes its reply to (a libp2p ``INetStream``)."""


MsgHandler = Callable[[MsgStream, str], Awaitable[None]]  # (stream, remote peer id): serves one protocol


class LedgerHost(Protocol):
    """What the ledger needs of the host: gossip (``publish`` on a chain ``topic``, ``subscribe``, the mesh of a
    topic), the connected peers, one request and its reply (within ``timeout`` seconds, the reply read up to
    ``max_message`` bytes), and serving a protocol.

    Raises (``request``): ``PeerUnreachable``, ``RemoteError``, ``StreamClosed``, ``FrameError``,
    ``RequestTimeout`` of :mod:`node.p2p`.
    """

    def topic(self, name: str) -> str: ...

    async def publish(self, topic: str, data: bytes) -> None: ...

    async def subscribe(self, topic: str, handler: GossipHandler, validate: GossipValidator | None = None) -> None: ...

    def mesh_peers(self, topic: str) -> list[str]: ...

    def connected_peers(self) -> list[str]: ...

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int = ...) -> dict[str, Any]: ...

    def set_handler(self, protocol_id: str, handler: MsgHandler) -> None: ...


class ConsensusLedger(Protocol):
    """What the driver needs of the ledger service that runs it: the head state and its genesis, the store
    (``head_time_ms``, ``last_commit``, ``get_block_raw``), the mempool (``verified``), the gossip host
    (:attr:`net`: ``publish``, ``topic``, ``mesh_peers``), a wall clock in seconds, and the calls below."""

    ident: Identity
    state: State
    genesis: Genesis
    store: LedgerStore
    mempool: Mempool
    clock: Callable[[], float]

    @property
    def chain_id(self) -> str: ...

    @property
    def net(self) -> LedgerHost: ...

    def candidates(self) -> list[Tx]: ...

    def drop_rejected(self, rejected: Iterable[tuple[Tx, str]]) -> None: ...

    def request_sync(self, peer: str) -> None: ...

    def on_block(self, fn: Callable[[Block, State], None]) -> None: ...

    async def submit(self, tx: Tx) -> bytes: ...

    async def commit_decided(self, block: Block, commit: Sequence[Sequence[Any]], new_state: State) -> bool: ...


__all__ = ["ConsensusLedger", "LedgerHost", "MsgHandler", "MsgStream"]
