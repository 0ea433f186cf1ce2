"""Real libp2p hosts on 127.0.0.1 with node.net's service: the genesis handshake gates Tally's protocols, peer
exchange finds peers, and a peer flooding streams and connections is limited while others are served."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack, asynccontextmanager, suppress

import pytest
import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from node.identity import Identity
from node.net.service import NetworkService
from node.p2p.framing import RemoteError, StreamClosed
from node.p2p.host import P2PHost, PeerUnreachable
from node.p2p.limits import Limits
from tests.p2p.util import run

G1, G2 = b"\x01" * 32, b"\x02" * 32
ECHO = "/tally/test-echo/1.0.0"


@asynccontextmanager
async def node(genesis: bytes, bootstrap=(), limits: Limits | None = None, tmp=None):
    host = P2PHost(Identity.generate(), 0, "tally-test", genesis_hash=genesis, limits=limits)
    net = NetworkService(host, genesis, list(bootstrap), tmp)

    async def echo(msg, remote):
        await trio.sleep(msg.get("sleep", 0))
        return {"echo": msg.get("x"), "from": remote}

    host.set_request_handler(ECHO, echo)
    async with host.running():
        await host.start_service(net.run)
        yield host, net


def test_wrong_genesis_refused_at_connection_with_both_hashes_and_same_genesis_served(caplog):
    caplog.set_level(logging.WARNING, logger="node.net.hello")

    async def main():
        async with AsyncExitStack() as st:
            a, na = await st.enter_async_context(node(G1))
            b, _nb = await st.enter_async_context(node(G1))
            x, _nx = await st.enter_async_context(node(G2))
            assert await b.connect(a.addrs) == 1
            reply = await b.request(a.peer_id, ECHO, {"x": 7}, timeout=10)
            assert reply["echo"] == 7 and na.hello.verified(b.peer_id)
            await x.connect(a.addrs)
            try:
                await x.request(a.peer_id, ECHO, {"x": 8}, timeout=10)
                raise AssertionError("a peer of another genesis was served")
            except (StreamClosed, PeerUnreachable, RemoteError):
                pass
            with trio.fail_after(10):
                while x.peer_id in a.connected_peers() or a.peer_id in x.connected_peers():
                    await trio.sleep(0.05)
            assert na.book.peers[x.peer_id].refused and a.banned(x.peer_id)
            assert a.topic("tx") != x.topic("tx")  # and their gossip never shares a topic

    run(main, timeout=40)
    lines = [r.getMessage() for r in caplog.records if "refusing peer" in r.getMessage()]
    assert any(G1.hex() in m and G2.hex() in m for m in lines), lines


def test_one_bootstrap_peer_finds_the_rest_through_peer_exchange():
    async def main():
        async with AsyncExitStack() as st:
            hub, _ = await st.enter_async_context(node(G1))
            others = [await st.enter_async_context(node(G1, bootstrap=hub.addrs)) for _ in range(3)]
            new, nnew = await st.enter_async_context(node(G1, bootstrap=hub.addrs))
            want = {h.peer_id for h, _ in others} | {hub.peer_id}
            with trio.fail_after(15):
                while not want <= set(nnew.book.peers) or not want <= set(new.connected_peers()):
                    await trio.sleep(0.1)

    run(main, timeout=40)


@pytest.mark.slow  # ~17 s: in CI's slow step, so the README's test command keeps its margin under 5 minutes
def test_a_stream_and_connection_flood_is_limited_while_another_peer_is_served():
    limits = Limits(streams_per_peer=32, stream_rate=50, stream_burst=64, conns_per_peer=4, conn_rate=30)

    async def main():
        async with AsyncExitStack() as st:
            a, _na = await st.enter_async_context(node(G1, limits=limits))
            honest, _ = await st.enter_async_context(node(G1))
            bad, _ = await st.enter_async_context(node(G1))
            await honest.connect(a.addrs)
            await bad.connect(a.addrs)
            await bad.request(a.peer_id, ECHO, {"x": 0}, timeout=10)  # verified first: the limits, not the gate
            served = []

            async def honest_loop():
                for i in range(40):
                    r = await honest.request(a.peer_id, ECHO, {"x": i}, timeout=10)
                    served.append(r["echo"])
                    await trio.sleep(0.02)

            async def stream_flood():
                lib = bad.libp2p
                for _ in range(1000):
                    try:
                        with trio.move_on_after(2):
                            s = await lib.new_stream(ID.from_base58(a.peer_id), [ECHO])
                            held.append(s)
                    except Exception:  # noqa: BLE001 - the node refuses most streams: any failure is expected
                        pass

            async def conn_flood():
                net = bad.libp2p.get_network()
                addr = Multiaddr(a.bound_addrs()[0])
                for _ in range(200):
                    with trio.move_on_after(2):
                        with suppress(Exception):  # the node refuses most dials: any failure is expected
                            await net.dial_addr(addr, ID.from_base58(a.peer_id))

            async def floods():
                await stream_flood()
                refused_before_conns.append(a.limiter.refused_streams)
                await conn_flood()

            held: list = []
            refused_before_conns: list[int] = []
            async with trio.open_nursery() as n:
                n.start_soon(honest_loop)
                n.start_soon(floods)
            assert served == list(range(40))  # every honest request answered, in order
            assert refused_before_conns[0] > 0 and a.limiter.refused_conns > 0
            assert a.banned(bad.peer_id) and not a.banned(honest.peer_id)
            assert a.limiter.conns.get(honest.peer_id, 0) >= 1
            with trio.fail_after(10):  # refused connections are closed in the background
                while len(a.libp2p.get_network().get_connections(ID.from_base58(bad.peer_id))) > \
                        limits.conns_per_peer:
                    await trio.sleep(0.1)

    run(main, timeout=120)
