"""An in-memory network for protocol tests: real SpanServers and a real RouteClient, streams in memory.

``FakeNet.open_stream`` hands the client one end of a ``trio.testing.memory_stream_pair`` and runs the server's
``handle`` on the other end, like the libp2p host does. ``kill(peer)`` makes a server vanish mid-session the way
a SIGKILLed process does for its clients: every stream to it hits EOF and it cannot be reached any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trio
import trio.testing

from node.blobs import BlobStore
from node.compute.executor import TorchExecutor
from node.compute.head import ClientHead
from node.compute.model import load_manifest
from node.compute.span import SpanModel
from node.disputes.duty import DisputeDuty
from node.encoding import pack
from node.identity import Identity, dev_seed
from node.inference.client import RouteClient
from node.inference.server import SpanServer
from node.inference.swarm import SwarmTable
from node.ledger.core.rows import Account
from node.p2p.host import PeerUnreachable

CHAIN = "tally-test"
PRICE = 100


class MemStream:
    """A libp2p-like stream (``read``/``write``/``close``/``reset``) over one end of a trio memory stream."""

    def __init__(self, s):
        self.s = s

    async def read(self, n: int) -> bytes:
        try:
            return await self.s.receive_some(n)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return b""

    async def write(self, data: bytes) -> None:
        await self.s.send_all(data)

    async def close(self) -> None:
        await self.s.aclose()

    reset = close


class NoAccounts:
    """A ledger state at height 0 where every account is empty (every server plans as a new one)."""

    height = 0

    def account(self, a: bytes, /) -> Account:
        return Account()


@dataclass
class FakeLedger:
    chain_id: str = CHAIN

    def __post_init__(self):
        class _P:
            price_per_token_block = PRICE

        class _G:
            params = _P()

        self.genesis = _G()
        self.state = NoAccounts()
        self.submitted: list = []

    async def submit(self, tx) -> bytes:
        self.submitted.append(tx)
        return tx.id


class FakeNet:
    def __init__(self, nursery, client_peer: str):
        self.nursery, self.client_peer = nursery, client_peer
        self.servers: dict[str, SpanServer] = {}
        self.dead: set[str] = set()
        self._open: dict[str, list] = {}
        self.peer_id = client_peer
        self.penalties: list[tuple[str, float]] = []
        self.client_ends: list[MemStream] = []

    def connected_peers(self) -> list[str]:
        return [p for p in self.servers if p not in self.dead]

    async def open_stream(self, peer: str, protocol: str, timeout: float = 10.0):
        if peer in self.dead or peer not in self.servers:
            raise PeerUnreachable(f"{peer} unreachable")
        a, b = trio.testing.memory_stream_pair()
        server_end = MemStream(b)
        self._open.setdefault(peer, []).append(server_end)

        async def serve():
            try:
                await self.servers[peer].handle(server_end, self.client_peer)
            finally:
                await server_end.close()

        self.nursery.start_soon(serve)
        client_end = MemStream(a)
        self.client_ends.append(client_end)
        return client_end

    async def drop_client(self) -> None:
        """The client vanishes: every stream it opened breaks (the servers read EOF)."""
        for s in self.client_ends:
            await s.close()

    async def kill(self, peer: str) -> None:
        """The server dies: its streams are torn down and it is unreachable from now on."""
        self.dead.add(peer)
        for s in self._open.pop(peer, []):
            await s.close()


def make_server(model_dir: Path, key: int, span: tuple[int, int], tmp: Path, net: FakeNet | None = None,
                device: str = "cpu", **kw) -> SpanServer:
    ident = Identity.from_seed(dev_seed(key))
    ledger = FakeLedger()
    server = SpanServer(ident, CHAIN, SpanModel(model_dir, *span, device=device), TorchExecutor(1),
                        BlobStore(tmp / f"s{key}"),
                        lambda: 7, PRICE, submit=ledger.submit,
                        penalize=(lambda p, w: net.penalties.append((p, w))) if net else None, **kw)
    server.ledger = ledger  # type: ignore[attr-defined]
    return server


async def announce(swarm: SwarmTable, server: SpanServer, seq: int = 1) -> None:
    await swarm.on_announcement(pack(server.announcement([], seq, 5.0)), server.ident.peer_id)


def make_client(model_dir: Path, net: FakeNet, tmp: Path, ident: Identity, **kw) -> RouteClient:
    """A route client over ``net`` whose receipts and disputes (the node's DisputeDuty, node.disputes) go to a
    FakeLedger."""
    manifest = load_manifest(model_dir)
    ledger = FakeLedger()
    kw.setdefault("disputes", DisputeDuty(ledger, ident))  # type: ignore[arg-type]  # a plain dispute: submit only
    return RouteClient(ident, net, ClientHead(model_dir), manifest, ledger, TorchExecutor(1),
                       BlobStore(tmp / "client"), SwarmTable(), step_timeout=5.0, **kw)


async def make_swarm(nursery, model_dir: Path, tmp: Path, spans: list[tuple[int, int]], **server_kw):
    """A FakeNet with a client (dev key 0) and one server per entry of ``spans`` (dev keys 1, 2, ... in order),
    each announced to the client. ``server_kw`` goes to :func:`make_server`. Returns ``(net, servers, client)``."""
    ident = Identity.from_seed(dev_seed(0))
    net = FakeNet(nursery, ident.peer_id)
    servers = []
    for key, span in enumerate(spans, start=1):
        s = make_server(model_dir, key, span, tmp, net, **server_kw)
        net.servers[s.ident.peer_id] = s
        servers.append(s)
    client = make_client(model_dir, net, tmp, ident)
    for s in servers:
        await announce(client.swarm, s)
    return net, servers, client
