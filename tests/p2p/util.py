"""Helpers for p2p tests: run an async body under trio with a hard deadline; start n hosts on 127.0.0.1."""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager

import trio

from node.identity import Identity
from node.net.hello import HELLO_PROTOCOL
from node.p2p.host import P2PHost

CHAIN = "test-chain"


def run(fn, *args, timeout: float = 20.0):
    """``trio.run(fn, *args)`` bounded by ``timeout`` seconds (raises trio.TooSlowError)."""

    async def main():
        with trio.fail_after(timeout):
            return await fn(*args)

    try:
        return trio.run(main)
    except BaseExceptionGroup as eg:  # hosts run nurseries: surface a lone failure as itself
        leaves = _leaves(eg)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(eg: BaseExceptionGroup) -> list[BaseException]:
    out = []
    for e in eg.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


@asynccontextmanager
async def running_hosts(n: int, **kw):
    """Start ``n`` unconnected hosts; yield the list; stop them all on exit."""
    hosts = [P2PHost(Identity.generate(), 0, CHAIN, **kw) for _ in range(n)]
    async with AsyncExitStack() as stack:
        for h in hosts:
            await stack.enter_async_context(h.running())
        yield hosts


class FakeStream:
    """In-memory stream: ``read(n)`` returns at most ``chunk`` bytes of the scripted data, then EOF (b"")."""

    def __init__(self, data: bytes = b"", chunk: int = 3):
        self.data = bytearray(data)
        self.chunk = chunk
        self.read_sizes: list[int] = []
        self.written = bytearray()

    async def read(self, n: int) -> bytes:
        await trio.lowlevel.checkpoint()
        self.read_sizes.append(n)
        out = bytes(self.data[:min(n, self.chunk)])
        del self.data[:len(out)]
        return out

    async def write(self, b: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.written += b


@asynccontextmanager
async def hello_peer(node, genesis, agent: str = "test"):
    """A fresh libp2p identity on 127.0.0.1, connected to the running in-process ``node`` and past its genesis
    hello (the node has verified it); yields ``(client host, hello map)``."""
    hello = {"chain_id": genesis.chain_id, "genesis": genesis.hash.hex(), "agent": agent, "addrs": []}
    client = P2PHost(Identity.generate(), 0, genesis.chain_id, genesis_hash=genesis.hash)

    async def answer_hello(msg: dict, remote: str) -> dict:
        return dict(hello)

    client.set_request_handler(HELLO_PROTOCOL, answer_hello)
    async with client.running():
        assert await client.connect(node.host.addrs) == 1
        await client.request(node.host.peer_id, HELLO_PROTOCOL, hello, timeout=10)
        with trio.fail_after(10):
            while not node.net.hello.verified(client.peer_id):
                await trio.sleep(0.05)
        yield client, hello
