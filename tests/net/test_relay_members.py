"""A relay for members (issue 23, finding 7): real py-libp2p hosts on 127.0.0.1, node.net.relay.Relay on the relay
with its member check wired to the relay's own genesis handshake (node.net.service.NetworkService).

Members (hosts that run NetworkService with the relay's genesis) get full circuits; a libp2p host that never says
hello gets circuit relay v2's defaults (128 KiB, 2 minutes) and only a few reservations.
"""

from __future__ import annotations

import struct
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode

from node.identity import Identity
from node.net.relay import OPEN_LIMITS, OPEN_RESERVATIONS, Relay
from node.net.service import NetworkService
from node.p2p.host import P2PHost
from tests.net.test_relay_reservations import connect_to_relay, raw_reserve, reserve
from tests.p2p.util import run

G = b"\x07" * 32
CHAIN = "tally-test"
SINK = "/tally-test/sink/1.0.0"  # a raw libp2p protocol: 8-byte length, then that many bytes; answers the count


async def _sink(stream) -> None:
    try:
        with trio.fail_after(20):
            head = b""
            while len(head) < 8:
                chunk = await stream.read(8 - len(head))
                if not chunk:
                    return
                head += chunk
            want, got = struct.unpack(">Q", head)[0], 0
            while got < want:
                chunk = await stream.read(min(65536, want - got))
                if not chunk:
                    return
                got += len(chunk)
            await stream.write(struct.pack(">Q", got))
    except Exception:  # noqa: BLE001 - a cut circuit: the pusher sees it
        return
    finally:
        await stream.close()


@asynccontextmanager
async def peer(member: bool, hop: bool = False, per_ip: int = 16):
    """A host with node.net.relay.Relay; ``member``: it also runs NetworkService (the genesis handshake)."""
    host = P2PHost(Identity.generate(), 0, CHAIN, genesis_hash=G if member else None)
    net = NetworkService(host, G) if member else None
    async with host.running():
        host.libp2p.set_stream_handler(SINK, _sink)
        if net is not None:
            await host.start_service(net.run)
        relay = Relay(host.libp2p, hop=hop, dcutr=False, per_ip=per_ip,
                      member=(lambda p: net.hello.wait_verified(p, 3.0)) if net is not None else None)
        await host.start_service(relay.run)
        yield host, relay, net


async def push(host: P2PHost, to: str, n: int) -> int | None:
    """Send ``n`` bytes to ``to``'s sink over a new stream; the count it answers, or None when the stream was cut."""
    try:
        with trio.fail_after(20):
            stream = await host.libp2p.new_stream(ID.from_base58(to), [SINK])
            await stream.write(struct.pack(">Q", n))
            block = b"\x00" * 16384
            for i in range(0, n, len(block)):
                await stream.write(block[:min(len(block), n - i)])
            reply = b""
            while len(reply) < 8:
                chunk = await stream.read(8 - len(reply))
                if not chunk:
                    return None
                reply += chunk
            await stream.close()
            return struct.unpack(">Q", reply)[0]
    except trio.TooSlowError:
        raise
    except Exception:  # noqa: BLE001 - reset by the relay
        return None


async def circuit(client, crelay: Relay, relay_host, server, srelay: Relay) -> None:
    """``server`` reserves on ``relay_host`` and ``client`` connects to it through the circuit."""
    await connect_to_relay(server, srelay, relay_host)
    assert await reserve(srelay) == relay_host.peer_id
    await connect_to_relay(client, crelay, relay_host)
    assert await crelay.dial(f"{srelay.circuit_addrs[0]}/p2p/{server.peer_id}")


def test_members_get_full_circuits_and_other_peers_the_circuit_relay_defaults():
    big = 3 * OPEN_LIMITS.data  # 384 KiB: three times what a non-member circuit may carry

    async def main():
        async with AsyncExitStack() as st:
            r, rr, rnet = await st.enter_async_context(peer(member=True, hop=True))
            ms, msr, _ = await st.enter_async_context(peer(member=True))
            mc, mcr, mcnet = await st.enter_async_context(peer(member=True))
            xs, xsr, _ = await st.enter_async_context(peer(member=False))
            xc, xcr, _ = await st.enter_async_context(peer(member=False))

            await circuit(mc, mcr, r, ms, msr)
            with trio.fail_after(10):  # the members' hello runs over the circuit too
                while not mcnet.hello.verified(ms.peer_id):
                    await trio.sleep(0.05)
            assert await push(mc, ms.peer_id, big) == big
            assert rr.protocol.circuits == {"member": 1, "open": 0}

            await circuit(xc, xcr, r, xs, xsr)
            assert await push(xc, xs.peer_id, 16 << 10) == 16 << 10  # enough for a hole punch's exchange
            assert await push(xc, xs.peer_id, big) is None  # cut at 128 KiB
            assert rr.protocol.circuits == {"member": 1, "open": 1}

            # the members' circuit is unaffected by the non-members'
            assert await push(mc, ms.peer_id, big) == big
            assert rnet.hello.verified(ms.peer_id) and not rnet.hello.verified(xs.peer_id)

    run(main, timeout=120)


@pytest.mark.slow  # ~25 s; the default suite must stay under 15 min
def test_non_members_hold_a_few_reservations_members_are_not_crowded_out():
    async def main():
        async with AsyncExitStack() as st:
            r, rr, _ = await st.enter_async_context(peer(member=True, hop=True, per_ip=64))
            outsiders = [await st.enter_async_context(peer(member=False)) for _ in range(OPEN_RESERVATIONS + 2)]
            codes = []
            for h, hr, _ in outsiders:
                await connect_to_relay(h, hr, r)
                codes.append(await raw_reserve(h, r.peer_id, None))
            assert codes == [StatusCode.OK] * OPEN_RESERVATIONS + [StatusCode.RESOURCE_LIMIT_EXCEEDED] * 2
            m, mr, mnet = await st.enter_async_context(peer(member=True))
            await connect_to_relay(m, mr, r)
            with trio.fail_after(10):
                while not mnet.hello.verified(r.peer_id):
                    await trio.sleep(0.05)
            assert await reserve(mr) == r.peer_id
            assert len(rr.protocol.reservations()) == OPEN_RESERVATIONS + 1
            # an outsider that leaves gives its reservation back to the next outsider
            h0 = outsiders[0][0]
            # it leaves for good: a mere disconnect is undone at once by py-libp2p, whose gossipsub redials every
            # peer it saw, so h0 also stops dialling the relay (a banned peer is never dialled: node.p2p.limits)
            h0.penalize(r.peer_id, 1e9)
            await h0.disconnect(r.peer_id)
            with trio.fail_after(10):
                while h0.peer_id in r.connected_peers():
                    await trio.sleep(0.05)
            assert await raw_reserve(outsiders[-1][0], r.peer_id, None) == StatusCode.OK

    run(main, timeout=120)
