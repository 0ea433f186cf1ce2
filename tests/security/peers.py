"""Attackers that are peers rather than floods: check 5's probe and the crashing or lying state-sync peers (see
:mod:`tests.security.attacker`)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import trio
from libp2p.host.ping import ID as PING
from libp2p.peer.id import ID

from node.identity import Identity
from node.net.hello import AGENT, HELLO_PROTOCOL
from node.p2p.framing import read_msg, write_msg
from node.p2p.host import P2PHost
from tests.security import payloads
from tests.security.common import peer, reset, target_parts

# ---------------------------------------------------------------------------------------------------- probe

async def probe(a: argparse.Namespace) -> dict:
    """Check 5: a fresh identity connects, pings and completes the hello, each step timed (seconds)."""
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
                await reset(s)
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
    ``READY <its multiaddr>`` once it holds a real offer and ``CHUNK <index>`` for each chunk asked of it, then
    serves for ``--seconds``."""
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
                    print("CHUNK", msg.get("index"), flush=True)  # the test: no chunk of a bad offer is asked for
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
