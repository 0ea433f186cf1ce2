"""Relay reservations are bound to the authenticated remote peer (node.net.relay.GuardedRelayProtocol): real
py-libp2p hosts on 127.0.0.1, the relay's own HOP protocol, forged RESERVE messages written on the wire."""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager

import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

from node.identity import Identity
from node.net.relay import MAX_RESERVATIONS_PER_IP, RELAY_LIMITS, Relay
from tests.p2p.util import run

ECHO = "/tally/test-echo/1.0.0"


@asynccontextmanager
async def relay_node(hop: bool, per_ip: int = MAX_RESERVATIONS_PER_IP):
    """A P2PHost on 127.0.0.1 running node.net.relay.Relay (no DCUtR: every peer is on this machine)."""
    from node.p2p.host import P2PHost

    host = P2PHost(Identity.generate(), 0, "tally-test")

    async def echo(msg, remote):
        return {"echo": msg.get("x"), "from": remote}

    host.set_request_handler(ECHO, echo)
    async with host.running():
        relay = Relay(host.libp2p, hop=hop, dcutr=False, per_ip=per_ip)
        await host.start_service(relay.run)
        yield host, relay


async def raw_reserve(host, relay_peer: str, named: bytes | None) -> StatusCode:
    """Write one RESERVE on a fresh HOP stream (``peer.id`` = ``named`` when given); the relay's status code."""
    stream = await host.libp2p.new_stream(ID.from_base58(relay_peer), [HOP_PROTOCOL])
    try:
        msg = HopMessage(type=HopMessage.RESERVE)
        if named is not None:
            msg.peer.CopyFrom(CircuitPeerId(id=named))
        with trio.fail_after(10):
            await write_delimited_msg(stream, msg)
            reply = await read_delimited_msg(stream, HopMessage)
        return StatusCode(reply.status)
    finally:
        await stream.close()


async def connect_to_relay(client, crelay: Relay, relay_host) -> None:
    assert await client.connect(relay_host.addrs) == 1
    with trio.fail_after(10):  # identify has told the client the relay speaks HOP
        while relay_host.peer_id not in crelay.relays():
            await trio.sleep(0.05)


async def reserve(crelay: Relay) -> str | None:
    with trio.fail_after(20):
        return await crelay.reserve()


def test_reservation_for_a_foreign_peer_id_is_refused_and_an_honest_one_works():
    async def main():
        async with AsyncExitStack() as st:
            r, rr = await st.enter_async_context(relay_node(hop=True))
            bad, _ = await st.enter_async_context(relay_node(hop=False))
            honest, hr = await st.enter_async_context(relay_node(hop=False))
            dialer, dr = await st.enter_async_context(relay_node(hop=False))
            assert await bad.connect(r.addrs) == 1

            # more made-up IDs than the relay has slots, and the honest peer's own ID: all refused
            forged = [ID.from_base58(Identity.generate().peer_id).to_bytes()
                      for _ in range(RELAY_LIMITS.max_reservations + 1)]
            forged.append(ID.from_base58(honest.peer_id).to_bytes())
            codes = [await raw_reserve(bad, r.peer_id, f) for f in forged]
            assert codes == [StatusCode.PERMISSION_DENIED] * len(forged)
            assert rr.protocol.reservations() == {}
            assert rr.protocol.refused_reservations == len(forged)

            # the honest peer, through Tally's own client path, gets its slot and is reachable through it
            await connect_to_relay(honest, hr, r)
            assert await reserve(hr) == r.peer_id
            assert hr.circuit_addrs == [f"{r.bound_addrs()[0]}/p2p/{r.peer_id}/p2p-circuit"]
            assert set(rr.protocol.reservations()) == {honest.peer_id}
            assert await dr.dial(f"{hr.circuit_addrs[0]}/p2p/{honest.peer_id}")
            reply = await dialer.request(honest.peer_id, ECHO, {"x": 5}, timeout=10)
            assert (reply["echo"], reply["from"]) == (5, dialer.peer_id)
            conns = dialer.libp2p.get_network().get_connections(ID.from_base58(honest.peer_id))
            assert conns and all("/p2p-circuit" in str(a) for c in conns for a in c.get_transport_addresses())

    run(main, timeout=90)


def test_one_peer_holds_one_reservation_and_one_ip_at_most_per_ip():
    async def main():
        async with AsyncExitStack() as st:
            r, rr = await st.enter_async_context(relay_node(hop=True, per_ip=2))
            peers = [await st.enter_async_context(relay_node(hop=False)) for _ in range(3)]
            (a, ar), (b, br), (c, cr) = peers
            for h, hr in peers:
                await connect_to_relay(h, hr, r)

            # a asks again and again, with its own ID and without one: still one slot, refreshed
            assert await reserve(ar) == r.peer_id
            mine = ID.from_base58(a.peer_id).to_bytes()
            assert [await raw_reserve(a, r.peer_id, n) for n in (mine, None, mine)] == [StatusCode.OK] * 3
            assert list(rr.protocol.reservations()) == [a.peer_id]

            # every peer here connects from 127.0.0.1: the second gets a slot, the third is refused
            assert await reserve(br) == r.peer_id
            assert await reserve(cr) is None
            assert rr.protocol.refused_reservations == 1
            assert set(rr.protocol.reservations()) == {a.peer_id, b.peer_id}
            assert set(rr.protocol.reservations().values()) == {"127.0.0.1"}

            # a reservation ends with its holder's connection: once a leaves, c gets the slot
            await a.disconnect(r.peer_id)
            with trio.fail_after(10):
                while a.peer_id in r.connected_peers():
                    await trio.sleep(0.05)
            assert await reserve(cr) == r.peer_id
            assert set(rr.protocol.reservations()) == {b.peer_id, c.peer_id}

    run(main, timeout=90)


def test_a_node_whose_relay_goes_away_reserves_on_another_and_announces_it():
    """NetworkService._relay_watch -> _rereserve: the circuit address announced follows the reservation."""
    from node.net.service import NetworkService

    genesis = b"\x07" * 32

    @asynccontextmanager
    async def service_node(hop: bool):
        async with relay_node(hop=hop) as (host, relay):
            # constructed, not run: its handshake handler serves, and the relay is the one started above (a
            # service run on loopback would make none, notes: loopback-only nodes need no relay)
            net = NetworkService(host, genesis)
            net.relay = relay
            yield host, relay, net

    async def main():
        async with AsyncExitStack() as st:
            relays = [await st.enter_async_context(service_node(hop=True)) for _ in range(2)]
            p, pr, net = await st.enter_async_context(service_node(hop=False))
            for r, _, _ in relays:
                await connect_to_relay(p, pr, r)
            with trio.fail_after(20):
                assert await net._rereserve()
            first = pr.reserved_on
            by_id = {r.peer_id: (r, rr) for r, rr, _ in relays}
            assert first in by_id and p.relay_addrs == pr.circuit_addrs
            assert p.relay_addrs == [f"{by_id[first][0].bound_addrs()[0]}/p2p/{first}/p2p-circuit"]
            (second,) = set(by_id) - {first}

            async with trio.open_nursery() as n:
                n.start_soon(net._relay_watch)
                await p.disconnect(first)
                with trio.fail_after(20):
                    while pr.reserved_on != second:
                        await trio.sleep(0.1)
                n.cancel_scope.cancel()
            assert p.relay_addrs == [f"{by_id[second][0].bound_addrs()[0]}/p2p/{second}/p2p-circuit"]
            assert p.peer_id in by_id[second][1].protocol.reservations()
            assert p.peer_id not in by_id[first][1].protocol.reservations()

    run(main, timeout=90)
