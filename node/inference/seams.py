"""What the inference package needs of the node's other parts, declared once: the torch executor, the host (as the
span server announces on it and as the route client dials and opens sessions through it), the ledger (as the client
reads and submits to it), the client head, and the callables the runtime hands a span server (height, submit,
penalize, tab_wait). The runtime (:meth:`node.runtime.Node._make_server`, the node's route clients) passes its
services; tests pass in-memory fakes of the same shape. Settlement by tabs has its own seam,
:mod:`node.inference.tabseam`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..compute.standing import Record
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import Receipt
from ..p2p.framing import ByteReader, ByteWriter

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

# () -> the ledger's height (blocks), read when a session opens
Height = Callable[[], int]
# ``await submit(receipt)``: a session's countersigned receipt to the ledger (or, with tabs, into the epoch book)
Submit = Callable[[Receipt | TabReceipt], Awaitable[object]]
# ``penalize(peer_id, weight)``: lower a peer's score (the host's :mod:`node.p2p.scoring`)
Penalize = Callable[[str, float], object]
# ``await tab_wait(height)``: until this node holds block ``height`` (bounded)
TabWait = Callable[[int], Awaitable[None]]


class SessionStream(ByteReader, ByteWriter, Protocol):
    """A session's stream as the server reads and writes it (a libp2p stream, or an in-memory pipe in tests)."""


class ClientStream(SessionStream, Protocol):
    """A session's stream as the client uses it: read, write, and reset when the hop is abandoned."""

    async def reset(self) -> None: ...


class AnnounceHost(Protocol):
    """The host as a span server announces on it (:class:`node.p2p.host.P2PHost`)."""

    @property
    def addrs(self) -> list[str]:
        """This node's announced multiaddrs, best first."""
        ...

    def topic(self, name: str) -> str:
        """The chain's full gossip topic of ``name``."""
        ...

    async def publish(self, topic: str, data: bytes) -> None:
        """Sign and publish ``data`` on ``topic``."""
        ...


class ClientHost(Protocol):
    """The host as the route client uses it (:class:`node.p2p.host.P2PHost`)."""

    @property
    def peer_id(self) -> str:
        """This node's peer ID."""
        ...

    def connected_peers(self) -> list[str]:
        """Peer IDs with an open connection."""
        ...

    async def connect(self, multiaddrs: list[str], timeout: float = ...) -> object:
        """Dial ``multiaddrs`` (each ending in ``/p2p/<peer id>``) within ``timeout`` seconds."""
        ...

    async def open_stream(self, peer_id: str, protocol_id: str, timeout: float = ...) -> ClientStream:
        """A new stream to ``peer_id`` speaking ``protocol_id`` (raises ``PeerUnreachable``)."""
        ...


class PriceParams(Protocol):
    """The genesis parameter the client prices sessions with."""

    @property
    def price_per_token_block(self) -> int: ...


class PricedGenesis(Protocol):
    """The chain's genesis as the client reads it."""

    @property
    def params(self) -> PriceParams: ...


class HeightState(Protocol):
    """The ledger state as the client reads it: its height, and a server's account (32-byte key -> its record,
    an empty one when unknown), whose verdicts weigh its routes (:mod:`node.compute.standing`)."""

    @property
    def height(self) -> int: ...

    def account(self, a: bytes, /) -> Record: ...


class ClientLedger(Protocol):
    """The ledger as the route client uses it (:class:`node.ledger.service.LedgerService`): the signing domain,
    the price, the state (its height, read for sessions on tabs; the servers' accounts, read to plan routes) and
    submission (receipts)."""

    @property
    def chain_id(self) -> str: ...

    @property
    def genesis(self) -> PricedGenesis: ...

    @property
    def state(self) -> HeightState: ...

    async def submit(self, tx: Receipt | TabReceipt, /) -> object: ...


class Disputes(Protocol):
    """The requester's disputes (:class:`node.disputes.duty.DisputeDuty`), which the redundant client hands the
    receipts its two routes disagreed on."""

    async def dispute(self, receipt: Receipt | TabReceipt, /) -> None:
        """Put ``receipt`` before a committee (a plain one at once, a tab receipt once its batch is on the ledger).

        Raises:
            ValueError: ``receipt`` is another requester's. InvalidTx: the local ledger refused the dispute.
        """
        ...


class Head(Protocol):
    """The client's end of the model (:class:`node.compute.head.ClientHead`, or the node's
    :class:`~node.compute.lazyhead.LazyHead`): embedding and greedy next token."""

    def embed_ids(self, ids: list[int]) -> torch.Tensor:
        """Embeddings ``(1, len(ids), hidden)`` of token ids."""
        ...

    def next_token(self, hidden: torch.Tensor) -> int:
        """Greedy next token after hidden states ``(1, tokens, hidden)``."""
        ...


__all__ = ["AnnounceHost", "ClientHost", "ClientLedger", "ClientStream", "Disputes", "Head", "Height",
           "Penalize",
           "SessionStream", "Submit", "TabWait"]


class Discover(Protocol):
    """Where a client's routes come from when servers publish DHT records (:class:`node.inference.dhtfeed.DhtFeed`)."""

    async def route(self, model_id: bytes, start: int, end: int, force: bool = False, /) -> int:
        """Feed the swarm table the records a route over blocks ``[start, end)`` of ``model_id`` can use (looked up
        again only after an interval, a shorter one when ``force``); returns how many were fed."""
        ...
