"""Hostile peers of the hostile-peer suite, one attack class per subcommand, each in its own process.

    python -m tests.security.attacker CLASS --target MULTIADDR --chain ID --genesis HEX --src IP --seconds S [...]

Classes (``--help`` of each lists its options):

* ``bomb``: nested-structure and length bombs (:mod:`tests.security.payloads`) on every ``/tally/*`` protocol,
  ``--phase pre`` (a peer that never completes the hello: only the hello is read before it) or ``post``;
* ``idle``: ``--sockets`` raw TCP connections that never send a byte, from ``--src`` or spread over its /24;
* ``identities``: fresh libp2p identities that connect, say a valid hello and stay;
* ``noread``: requests for the biggest replies (a model's head file, a snapshot chunk, a sync batch), never read;
* ``drip``: one byte per second: of a frame on every protocol after the hello, and of the multistream
  handshake on raw sockets;
* ``relay``: two non-members: one reserves a slot on the target, the other opens circuits to it through the
  target and pushes bytes;
* ``snapserve``: a lying or crashing state-sync peer (for a node started with ``--state-sync``);
* ``probe``: check 5: a fresh identity connects, pings and completes the hello; prints how long each took.

Each runs for ``--seconds`` (the probe: until done or its deadline) and prints one JSON line of what it managed.
Every socket leaves from ``--src`` (:func:`tests.security.srcaddr.bind_source`). Attackers renice themselves
(``--nice``) so that on a 2-core machine the attack measures the target, not the attacker's CPU use.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from node.identity import Identity
from node.net.hello import AGENT, HELLO_PROTOCOL
from node.p2p.framing import read_msg, write_msg
from node.p2p.host import P2PHost
from tests.security import payloads
from tests.security.srcaddr import bind_source

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
LIBP2P = ["/ipfs/id/1.0.0", "/ipfs/ping/1.0.0", "/meshsub/1.1.0", "/libp2p/circuit/relay/0.2.0/hop",
          "/libp2p/dcutr"]


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
            from node.net.service import NetworkService

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


async def _reset(stream) -> None:
    with trio.move_on_after(1.0):
        with suppress(Exception):  # an attacker shrugs off however the target cuts it
            await stream.reset()


# ---------------------------------------------------------------------------------------------------- bomb

async def bomb(a: argparse.Namespace) -> dict:
    """Every bomb of :func:`tests.security.payloads.bombs` on every protocol of the phase, ``--streams`` at once;
    a fresh identity whenever the target refuses this one's streams (it was banned), until ``--seconds``."""
    protos = a.protocols or (PRE_HELLO if a.phase == "pre" else list(TALLY) + LIBP2P)
    stats: dict[str, Any] = {"identities": 0, "connect_failed": 0, "written": 0, "streams": 0, "refused": 0,
                             "replies": 0, "bytes": 0}
    deadline = trio.current_time() + a.seconds
    cache: dict[int, dict[str, bytes]] = {}

    async def one(host, pid, proto: str, data: bytes, refused: list[int]) -> None:
        s = await raw_stream(host, pid, proto, timeout=min(10.0, max(0.5, deadline - trio.current_time())))
        if s is None:
            stats["refused"] += 1
            refused[0] += 1
            return
        stats["streams"] += 1
        try:
            with trio.move_on_after(max(0.5, min(10.0, deadline - trio.current_time()))):
                await s.write(data)
                stats["written"] += 1
                stats["bytes"] += len(data)
                if await s.read(1 << 16):
                    stats["replies"] += 1
        except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            pass
        await _reset(s)

    while trio.current_time() < deadline:
        stats["identities"] += 1
        try:
            async with peer(a, hello=a.phase == "post") as (host, pid):
                refused = [0]
                while trio.current_time() < deadline and refused[0] < 2 * a.streams:
                    for proto in protos:
                        size = min(TALLY.get(proto, 1 << 20), a.size)
                        for name, data in cache.setdefault(size, payloads.bombs(size)).items():
                            if (a.kinds and name not in a.kinds) or trio.current_time() >= deadline \
                                    or refused[0] >= 2 * a.streams:
                                continue
                            async with trio.open_nursery() as n:
                                for _ in range(a.streams):
                                    n.start_soon(one, host, pid, proto, data, refused)
        except (ConnectionError, trio.TooSlowError, OSError):
            stats["connect_failed"] += 1
            await trio.sleep(0.5)
    return stats


# ---------------------------------------------------------------------------------------------------- idle

def _sock(src: str, ip: str, port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((src, 0))
        s.settimeout(2.0)
        s.connect((ip, port))
        return s
    except OSError:
        s.close()
        return None


def _open(x: socket.socket) -> bool:
    """Whether the target still holds ``x`` open (what it sent, its multistream header, is read and dropped)."""
    x.setblocking(False)
    try:
        while x.recv(1 << 16):
            pass
        return False  # EOF
    except BlockingIOError:
        return True
    except OSError:
        return False


async def idle(a: argparse.Namespace) -> dict:
    ip, port, _ = target_parts(a.target)
    net = a.src.rsplit(".", 1)[0]
    srcs = [f"{net}.{2 + i % 248}" for i in range(a.sockets)] if a.spread else [a.src] * a.sockets
    held, failed, reopened = [], 0, 0
    t0 = time.monotonic()
    for s in srcs:
        x = await trio.to_thread.run_sync(_sock, s, ip, port)
        if x is None:
            failed += 1
        else:
            held.append((s, x))
    # hold them; reopen any the target closes, so the flood lasts the whole attack
    while time.monotonic() - t0 < a.seconds:
        await trio.sleep(0.5)
        for i, (s, x) in enumerate(held):
            if _open(x):
                continue
            x.close()
            y = await trio.to_thread.run_sync(_sock, s, ip, port)
            reopened += 1
            if y is not None:
                held[i] = (s, y)
    for _, x in held:
        x.close()
    return {"sockets": len(held), "failed": failed, "reopened": reopened,
            "sources": len(set(srcs))}


# ---------------------------------------------------------------------------------------------------- identities

async def identities(a: argparse.Namespace) -> dict:
    """Fresh identities, each its own bare py-libp2p host, connecting and saying a valid hello; at most
    ``--hold`` kept connected at once (the oldest are closed for new ones)."""
    from libp2p import new_host
    from libp2p.crypto.x25519 import create_new_key_pair as x25519_pair
    from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
    from libp2p.security.noise.transport import Transport as NoiseTransport
    from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
    from libp2p.stream_muxer.yamux.yamux import Yamux

    from node.p2p.host import libp2p_keypair

    pid = ID.from_base58(target_parts(a.target)[2])
    addr = Multiaddr(a.target.rsplit("/p2p/", 1)[0])
    hello = {"chain_id": a.chain, "genesis": a.genesis, "agent": AGENT, "addrs": []}
    stats = {"identities": 0, "connected": 0, "hello_ok": 0, "failed": 0, "dropped": 0}
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
        started = False
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
        stats["held_at_end"] = len(held)
        n.cancel_scope.cancel()
    return stats


def _info(pid: ID, addr: Multiaddr):
    from libp2p.peer.peerinfo import PeerInfo

    return PeerInfo(pid, [addr])


# ---------------------------------------------------------------------------------------------------- noread

async def noread(a: argparse.Namespace) -> dict:
    """Requests for the biggest replies the target has, on ``--streams`` streams per connection, never read."""
    stats = {"requests": 0, "refused": 0, "kinds": []}
    async with peer(a, hello=True) as (host, pid):
        reqs: list[tuple[str, dict]] = []
        if a.model_id:
            mid = bytes.fromhex(a.model_id)
            reqs.append(("/tally/block/1.0.0", {"model_id": mid, "type": "head"}))
            reqs.append(("/tally/block/1.0.0", {"model_id": mid, "type": "block", "index": 0}))
        try:
            offer = await host.request(pid.to_base58(), "/tally/snapshot/1.0.0", {"op": "offer"}, timeout=10.0)
            if offer.get("status") == "ok":
                m = offer["manifest"]
                sid = m.get("id") if isinstance(m, dict) else None
                if sid is not None:
                    reqs.append(("/tally/snapshot/1.0.0", {"op": "chunk", "snapshot": sid, "index": 0}))
        except Exception as e:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            stats["snapshot"] = f"{type(e).__name__}: {e}"[:120]
        reqs.append(("/tally/sync/1.0.0", {"from": 1}))
        reqs.append(("/tally/snapshot/1.0.0", {"op": "light", "from": 1, "count": 64}))
        stats["kinds"] = sorted({p.rsplit("/", 2)[1] for p, _ in reqs})
        held = []
        deadline = trio.current_time() + a.seconds
        while trio.current_time() < deadline and len(held) < a.streams:
            for proto, msg in reqs:
                s = await raw_stream(host, pid, proto, timeout=5.0)
                if s is None:
                    stats["refused"] += 1
                    continue
                try:
                    await write_msg(s, msg, timeout=5.0)
                    held.append(s)
                    stats["requests"] += 1
                except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
                    stats["refused"] += 1
        await trio.sleep(max(0.0, deadline - trio.current_time()))
        for s in held:
            await _reset(s)
    return stats


# ---------------------------------------------------------------------------------------------------- drip

async def drip(a: argparse.Namespace) -> dict:
    """One byte per second: a frame on every Tally protocol after the hello (``--streams`` each), and the
    multistream-select header on ``--sockets`` raw TCP connections (a handshake dripped)."""
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
        await _reset(s)

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


# ---------------------------------------------------------------------------------------------------- relay

async def relay(a: argparse.Namespace) -> dict:
    """Two non-members (no hello): ``A`` reserves a slot on the target; ``B`` dials ``A`` through the target
    and pushes bytes on ``--streams`` streams for the rest of the attack."""
    from node.net.relay import Relay

    sink = "/tally/test/sink/1.0.0"
    stats: dict[str, Any] = {"reserved": False, "circuit": False, "pushed": 0, "received": 0}

    async def drain(stream) -> None:
        try:
            while True:
                data = await stream.read(1 << 16)
                if not data:
                    break
                stats["received"] += len(data)
        except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            pass

    deadline = trio.current_time() + a.seconds
    async with AsyncExitStack() as st:
        ha, pid = await st.enter_async_context(peer(a, hello=False))
        ha.libp2p.set_stream_handler(sink, drain)
        ra = Relay(ha.libp2p, hop=False, dcutr=False)
        await ha.start_service(ra.run)
        hb, _ = await st.enter_async_context(peer(a, hello=False))
        rb = Relay(hb.libp2p, hop=False, dcutr=False)
        await hb.start_service(rb.run)
        with trio.move_on_after(20):
            while pid.to_base58() not in ra.relays():
                await trio.sleep(0.1)
        stats["reserved"] = await ra.reserve() is not None
        if not stats["reserved"]:
            return stats
        circuit = f"{a.target}/p2p-circuit/p2p/{ha.peer_id}"
        stats["circuit"] = await rb.dial(circuit, timeout=20.0)
        if not stats["circuit"]:
            return stats
        chunk = b"\x00" * (1 << 16)

        async def push() -> None:
            try:
                s = await hb.libp2p.new_stream(ID.from_base58(ha.peer_id), [sink])
                while trio.current_time() < deadline:
                    await s.write(chunk)
                    stats["pushed"] += len(chunk)
            except Exception as e:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
                stats["error"] = f"{type(e).__name__}: {e}"[:160]

        with trio.move_on_after(max(0.0, deadline - trio.current_time())):
            async with trio.open_nursery() as n:
                for _ in range(a.streams):
                    n.start_soon(push)
    return stats


# ---------------------------------------------------------------------------------------------------- probe

async def probe(a: argparse.Namespace) -> dict:
    """Check 5: a fresh identity connects, pings and completes the hello, each step timed (seconds)."""
    from libp2p.host.ping import ID as PING

    out: dict[str, Any] = {"ok": False}
    t0 = time.monotonic()
    host = P2PHost(Identity.generate(), 0, a.chain, listen_host=a.src, genesis_hash=bytes.fromhex(a.genesis))
    pid = ID.from_base58(target_parts(a.target)[2])
    try:
        with trio.fail_after(a.seconds):
            async with host.running():
                if await host.connect([a.target], timeout=a.seconds) != 1:
                    out["error"] = "connect failed"
                    return out
                out["connect_s"] = round(time.monotonic() - t0, 3)
                s = await host.libp2p.new_stream(pid, [str(PING)])
                payload = os.urandom(32)
                await s.write(payload)
                got = b""
                while len(got) < 32:
                    chunk = await s.read(32 - len(got))
                    if not chunk:
                        break
                    got += chunk
                await _reset(s)
                out["ping_ok"] = got == payload
                out["ping_s"] = round(time.monotonic() - t0, 3)
                reply = await host.request(pid.to_base58(), HELLO_PROTOCOL,
                                           {"chain_id": a.chain, "genesis": a.genesis, "agent": AGENT,
                                            "addrs": []}, timeout=a.seconds)
                out["hello_ok"] = reply.get("genesis") == a.genesis
                out["hello_s"] = round(time.monotonic() - t0, 3)
                out["ok"] = bool(out["ping_ok"] and out["hello_ok"])
    except BaseException as e:  # the verdict is the output; KeyboardInterrupt re-raised
        if isinstance(e, KeyboardInterrupt):
            raise
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    out["total_s"] = round(time.monotonic() - t0, 3)
    return out


# ---------------------------------------------------------------------------------------------------- snapserve

SNAPSHOT = "/tally/snapshot/1.0.0"


def forged_offer(honest: dict, mode: str) -> dict:
    """The target's real offer ``honest`` bent by ``mode``: ``crash`` (its commit is the integer 5, the issue's
    TypeError), ``garbage`` (the manifest is 5) or ``lie`` (a manifest claiming height 10^12 and 16,000 chunks,
    under the real, certified header)."""
    if mode == "crash":
        return {**honest, "block": {**honest["block"], "c": 5}}
    if mode == "garbage":
        return {**honest, "manifest": 5}
    chain, _, last, seq, counts, root, _ = honest["manifest"]
    # 16,000 chunk ids: ~550 KB, under a 1 MiB offer limit, so that only the certified header can refuse it
    return {**honest, "manifest": [chain, 10**12, last, seq, counts, root, [os.urandom(32) for _ in range(16000)]]}


async def snapserve(a: argparse.Namespace) -> dict:
    """A member (valid hello) that serves ``/tally/snapshot`` to whoever state-syncs from it: offers bent by
    ``--mode`` (:func:`forged_offer`); chunks dripped one byte every 5 s behind a frame header claiming 1 MiB;
    headers (``light``) fetched from the target, so that a lie is only visible in the manifest. Prints
    ``READY <its multiaddr>`` once it holds a real offer, then serves for ``--seconds``."""
    stats: dict[str, Any] = {"mode": a.mode, "offers": 0, "chunks": 0, "light": 0}
    async with peer(a, hello=True) as (host, pid):
        target = pid.to_base58()
        honest = None
        with trio.move_on_after(a.seconds):
            while honest is None:
                try:
                    honest = await host.request(target, SNAPSHOT, {"op": "offer"}, timeout=10.0)
                except Exception:  # noqa: BLE001 - no snapshot yet: ask again
                    await trio.sleep(1.0)
        if honest is None:
            stats["error"] = "the target never offered a snapshot"
            return stats
        offer = forged_offer(honest, a.mode)

        async def handle(stream, remote: str) -> None:
            try:
                msg = await read_msg(stream, 10.0, max_message=1 << 12)
                op = msg.get("op")
                if op == "offer":
                    stats["offers"] += 1
                    await write_msg(stream, offer, timeout=30.0)
                elif op == "light":
                    stats["light"] += 1
                    reply = await host.request(target, SNAPSHOT, msg, timeout=10.0, max_message=16 << 20)
                    await write_msg(stream, reply, timeout=30.0)
                elif op == "chunk":
                    stats["chunks"] += 1
                    await stream.write(payloads.HDR.pack(1 << 20, 0))
                    while True:
                        await stream.write(b"\x00")
                        await trio.sleep(5.0)
            except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
                pass

        host.set_handler(SNAPSHOT, handle)
        print("READY", f"{host.addrs[0]}", flush=True)
        await trio.sleep(a.seconds)
    return stats


CLASSES = {"bomb": bomb, "idle": idle, "identities": identities, "noread": noread, "drip": drip, "relay": relay,
           "probe": probe, "snapserve": snapserve}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="attacker", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cls", required=True)
    for name in CLASSES:
        s = sub.add_parser(name, help=(CLASSES[name].__doc__ or name).split("\n")[0])
        s.add_argument("--target", required=True, help="/ip4/IP/tcp/PORT/p2p/ID of the target")
        s.add_argument("--chain", required=True)
        s.add_argument("--genesis", required=True, help="genesis hash, hex")
        s.add_argument("--src", default="127.0.0.2", help="loopback address every socket leaves from")
        s.add_argument("--seconds", type=float, default=15.0, help="how long the attack lasts")
        s.add_argument("--nice", type=int, default=5, help="niceness increment of this process")
        if name == "bomb":
            s.add_argument("--phase", choices=["pre", "post"], default="post")
            s.add_argument("--protocols", nargs="*", help="default: every protocol of the phase")
            s.add_argument("--kinds", nargs="*", help="default: every bomb of tests/security/payloads.py")
            s.add_argument("--size", type=int, default=8 << 20, help="bomb size in bytes (capped per protocol)")
            s.add_argument("--streams", type=int, default=4, help="streams at once per bomb")
        if name == "idle":
            s.add_argument("--sockets", type=int, default=300)
            s.add_argument("--spread", action="store_true", help="spread the sockets over --src's /24")
        if name == "identities":
            s.add_argument("--hold", type=int, default=300, help="identities kept connected at once")
            s.add_argument("--parallel", type=int, default=16, help="identities connecting at once")
        if name == "noread":
            s.add_argument("--model-id", help="hex id of the target's model (its head and blocks are fetched)")
            s.add_argument("--streams", type=int, default=100, help="requests held unread in all")
        if name == "drip":
            s.add_argument("--streams", type=int, default=4, help="dripped streams per protocol")
            s.add_argument("--sockets", type=int, default=32, help="raw sockets dripping the handshake")
        if name == "snapserve":
            s.add_argument("--mode", choices=["crash", "garbage", "lie"], default="crash")
        if name == "relay":
            s.add_argument("--streams", type=int, default=4, help="streams pushing through the circuit")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    bind_source(a.src)
    if a.nice:
        os.nice(a.nice)
    t0 = time.monotonic()
    out = trio.run(CLASSES[a.cls], a)
    out["class"], out["elapsed_s"] = a.cls, round(time.monotonic() - t0, 2)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
