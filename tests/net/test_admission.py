"""Limits before the handshake, against a real node (P2PHost + NetworkService) on 127.0.0.1.

Attackers dial from 127.0.0.x (one /24), honest peers from 127.0.1.x (another /24), through
:mod:`tests.net.srcbind`. After every attack a fresh identity from the attacker's address and one from another
address must connect, ping and complete the hello within seconds (issue 23, check 5).
"""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path

import pytest
import trio
from libp2p.host.ping import PingService
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from node.identity import Identity
from node.net.service import NetworkService
from node.p2p.host import P2PHost
from node.p2p.limits import Limits
from tests.net.srcbind import idle_sockets, source
from tests.p2p.util import run

G1 = b"\x01" * 32
CHAIN = "tally-test"


@asynccontextmanager
async def node(genesis: bytes = G1, identity: Identity | None = None, **kw):
    host = P2PHost(identity or Identity.generate(), 0, CHAIN, genesis_hash=genesis, **kw)
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


@pytest.mark.slow  # ~30 s of connection churn; the default suite must stay under 15 min
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
                assert refused.get("pending_per_ip", 0) + refused.get("open_per_ip", 0) > 200, refused
            finally:
                for s in socks:
                    s.close()
            await settled(a)
            await fresh_peer(a, na, "127.0.0.2")
            await fresh_peer(a, na, "127.0.1.6")

    run(main, timeout=90)


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~17 s: in CI's slow step, so the README's test command keeps its margin under 5 minutes
def test_a_flood_from_one_slash24_leaves_other_subnets_and_reserved_addresses_served():
    """Idle sockets from 127.0.0.2-127.0.0.200 (one /24), opened without pause by another process for 15 s: a
    peer from 127.0.1.5 (another /24) and one from a reserved address inside the flooded /24 still connect."""

    async def main():
        async with node() as (a, na):
            a.reserve(ips=["127.0.0.201"])
            proc = subprocess.Popen([sys.executable, "-m", "tests.net.srcbind", "127.0.0.2", "127.0.0.200",
                                     "127.0.0.1", str(_port(a)), "15", "1000"], cwd=ROOT,
                                    stdout=subprocess.PIPE, text=True)
            try:
                with trio.fail_after(10):
                    refused = a.admission.refused
                    while not (refused["pending_per_subnet"] + refused["accept_rate_per_subnet"]):
                        await trio.sleep(0.1)
                took = await fresh_peer(a, na, "127.0.1.5", within=10.0)
                took_reserved = await fresh_peer(a, na, "127.0.0.201", within=10.0)
                assert proc.poll() is None, "the flood ended before the honest peers were done"
                out, _ = await trio.to_thread.run_sync(proc.communicate, None, 30)
            finally:
                proc.kill()
                proc.wait()
            assert int(out) > 500, out  # the flood really flooded
            refused = na.status()["refused_before_handshake"]
            assert refused.get("pending_per_subnet", 0) + refused.get("accept_rate_per_subnet", 0) > 100, refused
            print(f"flood: {out.strip()} sockets, refused {refused}, honest {took:.2f} s, reserved "
                  f"{took_reserved:.2f} s")
            await settled(a)
            await fresh_peer(a, na, "127.0.0.2")
            await fresh_peer(a, na, "127.0.1.6")

    run(main, timeout=120)


@asynccontextmanager
async def bare(identity: Identity | None = None):
    """A libp2p host that never says hello."""
    h = P2PHost(identity or Identity.generate(), 0, CHAIN)
    async with h.running():
        yield h


def test_an_identity_flood_fills_max_conns_but_validators_connect_and_dial_each_other():
    """Fresh identities fill Limits.max_conns; a reserved peer (a validator) still connects, the node still dials
    another validator, a newcomer is turned away; when the flood ends, newcomers connect again."""

    async def main():
        v1, v2 = Identity.generate(), Identity.generate()
        async with AsyncExitStack() as st:
            a, na = await st.enter_async_context(node(limits=Limits(max_conns=8)))
            a.reserve(peers=[v1.peer_id, v2.peer_id])
            h1, n1 = await st.enter_async_context(node(identity=v1))
            h2, _ = await st.enter_async_context(node(identity=v2))
            async with AsyncExitStack() as flood:
                bad = [await flood.enter_async_context(bare()) for _ in range(10)]
                with source("127.0.0.3"):
                    for b in bad:
                        await b.connect(a.addrs, timeout=5.0)
                with trio.fail_after(10):
                    while len(a.connected_peers()) < 8:
                        await trio.sleep(0.05)
                assert a.limiter.refused_conns >= 1  # the 9th and 10th were closed
                with source("127.0.1.7"), trio.fail_after(15):
                    assert await h1.connect(a.addrs) == 1
                    while not (n1.hello.verified(a.peer_id) and na.hello.verified(v1.peer_id)):
                        await trio.sleep(0.05)
                with trio.fail_after(15):
                    assert await a.connect(h2.addrs) == 1  # outbound: not held to max_conns
                    while not na.hello.verified(v2.peer_id):
                        await trio.sleep(0.05)
                refused = a.limiter.refused_conns
                got_in = False
                with trio.move_on_after(8), suppress(Exception):  # closed as it opens: ping or hello fails
                    await fresh_peer(a, na, "127.0.1.5")
                    got_in = True
                assert not got_in, "a newcomer got in while max_conns was full"
                assert a.limiter.refused_conns > refused
                assert v1.peer_id in a.connected_peers() and v2.peer_id in a.connected_peers()
            with trio.fail_after(15):  # the flood's hosts stopped: their slots come back
                while len(a.connected_peers()) > 2 or a.admission.open > 1:
                    await trio.sleep(0.1)
            await fresh_peer(a, na, "127.0.0.3")
            await fresh_peer(a, na, "127.0.1.6")

    run(main, timeout=120)


def test_a_peer_that_never_says_hello_is_disconnected():
    async def main():
        async with node(limits=Limits(hello_timeout=2.0)) as (a, na), bare() as b:
            with source("127.0.0.4"):
                assert await b.connect(a.addrs) == 1
            with trio.fail_after(10):
                while b.peer_id in a.connected_peers():
                    await trio.sleep(0.1)
            assert a.admission.open == 0  # its inbound slot is back too
            assert na.status()["closed_without_hello"] == 1
            async with node() as (m, _):
                with source("127.0.0.4"):
                    assert await m.connect(a.addrs) == 1
                await trio.sleep(5.0)  # past the deadline, twice over: a member stays
                assert m.peer_id in a.connected_peers() and na.hello.verified(m.peer_id)

    run(main, timeout=60)


@pytest.mark.slow  # ~35 s; the default suite must stay under 15 min
def test_a_banned_identity_that_probed_every_protocol_and_keeps_reconnecting_locks_nobody_out():
    """Finding 6 as reported: one identity sends malformed frames on every protocol the node serves until it is
    banned, then keeps reconnecting (300 times). Every refusal is counted (the report saw refused_connections stop
    moving) and fresh peers from its address and from another connect, ping and say hello within seconds."""

    async def main():
        async with node() as (a, na):
            async with node() as (bad, _):
                with source("127.0.0.9"):
                    assert await bad.connect(a.addrs) == 1
                pid = ID.from_base58(a.peer_id)
                protocols = sorted(str(p) for p in a.libp2p.get_mux().get_protocols() if p)
                assert len(protocols) >= 5, protocols
                frames = 0
                with trio.fail_after(60):
                    while not a.banned(bad.peer_id):
                        for proto in protocols:
                            with trio.move_on_after(2.0), suppress(Exception):
                                s = await bad.libp2p.new_stream(pid, [proto])
                                await s.write(b"\xff" * 48)  # no valid length prefix, msgpack or protobuf
                                frames += 1
                                await s.reset()
                            if a.banned(bad.peer_id):
                                break
                refused = na.status()["refused_connections"]
                net = bad.libp2p.get_network()
                addr = Multiaddr(a.addrs[0].rsplit("/p2p/", 1)[0])
                with source("127.0.0.9"):
                    for _ in range(300):
                        net.unblock_peer(pid)
                        with trio.move_on_after(3.0), suppress(Exception):
                            conn = await net.dial_addr(addr, pid)
                            await conn.close()
                again = na.status()["refused_connections"] - refused
                assert again > 100, again  # still counting: nothing got stuck before Tally's limits
            await settled(a)
            t1 = await fresh_peer(a, na, "127.0.0.9")
            t2 = await fresh_peer(a, na, "127.0.1.8")
            print(f"banned after {frames} malformed frames on {len(protocols)} protocols ({', '.join(protocols)}); "
                  f"{again} reconnections refused; then fresh peers in {t1:.2f} s and {t2:.2f} s")

    run(main, timeout=150)
