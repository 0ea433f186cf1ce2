"""What every attacker of :mod:`tests.security.attacker` shares: the protocols it plays, the target's address,
a fresh identity's host connected to the target, raw streams."""

from __future__ import annotations

import argparse
from contextlib import asynccontextmanager, suppress

import trio
from libp2p.peer.id import ID

from node.identity import Identity
from node.net.service import NetworkService
from node.p2p.host import P2PHost

TALLY = {  # protocol -> the largest message it should accept (what a bomb is sized to)
    "/tally/hello/1.0.0": 8 << 20,
    "/tally/dialback/1.0.0": 8 << 20,
    "/tally/peers/1.0.0": 8 << 20,
    "/tally/inference/2.0.0": 8 << 20,
    "/tally/snapshot/1.0.0": 1 << 20,
    "/tally/sync/1.0.0": 1 << 20,
    "/tally/submit/1.0.0": 8 << 20,
    "/tally/block/1.0.0": 8 << 20,
    "/tally/batch/1.0.0": 1 << 20,
    "/tally/blob/1.0.0": 1 << 20,
}
PRE_HELLO = ["/tally/hello/1.0.0", "/tally/dialback/1.0.0"]
LIBP2P = ["/ipfs/id/1.0.0", "/ipfs/id/push/1.0.0", "/ipfs/ping/1.0.0", "/meshsub/1.1.0", "/meshsub/1.2.0",
          "/libp2p/circuit/relay/0.2.0/hop", "/libp2p/circuit/relay/0.2.0/stop", "/libp2p/dcutr"]


def target_parts(target: str) -> tuple[str, int, str]:
    """``(ip, port, peer id)`` of ``/ip4/IP/tcp/PORT/p2p/ID``."""
    p = target.split("/")
    return p[2], int(p[4]), p[6]


@asynccontextmanager
async def peer(a: argparse.Namespace, hello: bool):
    """A fresh identity's host on ``a.src`` connected to the target, after a valid hello when ``hello``;
    yields ``(host, target peer ID)``."""
    host = P2PHost(Identity.generate(), 0, a.chain, listen_host=a.src, genesis_hash=bytes.fromhex(a.genesis))
    pid = ID.from_base58(target_parts(a.target)[2])
    async with host.running():
        if hello:
            net = NetworkService(host, bytes.fromhex(a.genesis))
            await host.start_service(net.run)
        if await host.connect([a.target], timeout=20.0) != 1:
            raise ConnectionError("attacker: could not connect to the target")
        if hello:
            with trio.fail_after(30):
                while not net.hello.verified(pid.to_base58()):
                    await trio.sleep(0.05)
        yield host, pid


async def raw_stream(host: P2PHost, pid: ID, proto: str, timeout: float = 10.0):
    """A new stream on ``proto`` (None when refused or too slow)."""
    with trio.move_on_after(timeout):
        try:
            return await host.libp2p.new_stream(pid, [proto])
        except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            return None
    return None


async def reset(stream) -> None:
    """Reset ``stream``, whatever state the target left it in (at most 1 s)."""
    with trio.move_on_after(1.0):
        with suppress(Exception):  # an attacker shrugs off however the target cuts it
            await stream.reset()
