"""Limits before the handshake, against a real node (P2PHost + NetworkService) on 127.0.0.1.

Attackers dial from 127.0.0.x (one /24), honest peers from 127.0.1.x (another /24), through
:mod:`tests.net.srcbind`. After every attack a fresh identity from the attacker's address and one from another
address must connect, ping and complete the hello within seconds (issue 23, check 5).
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager, suppress

import trio
from libp2p.host.ping import PingService
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from node.identity import Identity
from node.net.service import NetworkService
from node.p2p.host import P2PHost
from tests.net.srcbind import idle_sockets, source
from tests.p2p.util import run

G1 = b"\x01" * 32
CHAIN = "tally-test"


@asynccontextmanager
async def node(genesis: bytes = G1, **kw):
    host = P2PHost(Identity.generate(), 0, CHAIN, genesis_hash=genesis, **kw)
    net = NetworkService(host, genesis)
    async with host.running():
        await host.start_service(net.run)
        yield host, net


def _port(host: P2PHost) -> int:
    return int(host.bound_addrs()[0].split("/")[4])


async def fresh_peer(target: P2PHost, tnet: NetworkService, ip: str, within: float = 15.0) -> float:
    """A new identity dialling from ``ip`` connects to ``target``, pings it and completes the hello both ways;
    returns the seconds it took. Raises trio.TooSlowError past ``within``."""
    t0 = time.monotonic()
    h = P2PHost(Identity.generate(), 0, CHAIN, genesis_hash=tnet.hello.genesis_hash)
    n = NetworkService(h, tnet.hello.genesis_hash)
    async with h.running():
        await h.start_service(n.run)
        with trio.fail_after(within):
            with source(ip):
                while await h.connect(target.addrs, timeout=5.0) != 1:
                    await trio.sleep(0.2)
            rtts = await PingService(h.libp2p).ping(ID.from_base58(target.peer_id), 1)
            assert len(rtts) == 1
            while not (n.hello.verified(target.peer_id) and tnet.hello.verified(h.peer_id)):
                await trio.sleep(0.05)
    return time.monotonic() - t0


async def settled(target: P2PHost, within: float = 15.0) -> None:
    """Wait until the node holds no inbound connection counts (all attackers gone)."""
    with trio.fail_after(within):
        while target.admission.open or target.admission.pending:
            await trio.sleep(0.1)


async def churn(target: P2PHost, ip: str, n: int) -> int:
    """One identity (no hello) opens ``n`` connections to ``target`` from ``ip``, one after another, each closed
    by the node (limits, ban) or by us. Returns how many upgraded."""
    bad = P2PHost(Identity.generate(), 0, CHAIN)
    ok = 0
    async with bad.running():
        net = bad.libp2p.get_network()
        pid = ID.from_base58(target.peer_id)
        addr = Multiaddr(target.addrs[0].rsplit("/p2p/", 1)[0])
        with source(ip):
            for _ in range(n):
                net.unblock_peer(pid)
                with trio.move_on_after(3.0), suppress(Exception):
                    conn = await net.dial_addr(addr, pid)
                    ok += 1
                    await conn.close()
    return ok


def test_connections_that_closed_give_their_inbound_slot_back():
    """Finding 6: py-libp2p 0.8.1 holds one of its 250 inbound slots per upgraded connection until the swarm
    stops, so a banned peer's 260 short connections locked every new peer out for good."""

    async def main():
        async with node() as (a, na):
            n = await churn(a, "127.0.0.2", 260)
            assert n > 0
            await settled(a)  # every connection that closed gave its counts back
            await fresh_peer(a, na, "127.0.1.5")
            await fresh_peer(a, na, "127.0.0.2")

    run(main, timeout=150)


def test_idle_sockets_from_one_address_do_not_lock_out_others():
    """Finding 2: 260 raw sockets from one address, no byte sent, took every inbound slot for 10 s."""

    async def main():
        async with node() as (a, na):
            socks = await trio.to_thread.run_sync(idle_sockets, "127.0.0.2", ("127.0.0.1", _port(a)), 260)
            try:
                assert len(socks) > 200
                took = await fresh_peer(a, na, "127.0.1.5", within=8.0)
                assert took < 8.0
                refused = a.admission.stats()["refused_before_handshake"]
                assert refused.get("pending_per_ip", 0) > 200, refused
            finally:
                for s in socks:
                    s.close()
            await settled(a)
            await fresh_peer(a, na, "127.0.0.2")
            await fresh_peer(a, na, "127.0.1.6")

    run(main, timeout=90)
