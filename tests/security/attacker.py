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
* ``probe``: check 5: a fresh identity connects, pings and completes the hello; prints how long each took;
* ``spin``: no attack, a control: the process only keeps its CPU busy, as a busy attacker would (``bench/attack.py``
  measures with it what an attacker's own CPU use costs the honest client when the cores are shared or loaded).

Each runs for ``--seconds`` (the probe: until done or its deadline) and prints one JSON line of what it managed,
counted on its own sockets and streams (connections made and held, streams opened, bytes written, identities
that completed the hello, refusals and resets seen), never the numbers it was asked for alone:
:func:`tests.security.devnet.attack_shortfalls` fails a test whose attack did too little to count.
Every socket leaves from ``--src`` (:func:`tests.security.srcaddr.bind_source`). Attackers renice themselves
(``--nice``) so that on a 2-core machine the attack measures the target, not the attacker's CPU use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

import trio
from libp2p.peer.id import ID

from node.ledger.snapshot import Manifest
from node.net.relay import Relay
from node.p2p.framing import write_msg
from tests.security import payloads
from tests.security.common import LIBP2P, PRE_HELLO, TALLY, peer, raw_stream, reset
from tests.security.floods import drip, identities, idle
from tests.security.peers import probe, snapserve
from tests.security.srcaddr import bind_source

CHUNK = 1 << 16  # bytes per write of a bomb (yamux sends at most its window per frame anyway)

# ---------------------------------------------------------------------------------------------------- bomb

async def bomb(a: argparse.Namespace) -> dict:
    """Every bomb of :func:`tests.security.payloads.bombs` on every protocol of the phase, ``--streams`` at once
    per protocol, the protocols side by side (one after another, a target that stalls or bans on the first
    would never see the rest within a 15 s attack); a fresh identity whenever the target refuses this one's
    streams (it was banned), each protocol going on from its next bomb, until ``--seconds`` (and on, at most as
    long again, while one of Tally's protocols has taken no bytes; a fresh identity starts with the protocols that
    took the fewest).

    Reports what reached the target: identities made and those connected (after a verified hello in ``post``),
    streams opened, bytes written (counted per :data:`CHUNK` whose write returned, so a bomb the target cut
    midway counts what it took), bombs written whole, streams cut mid-write, refused streams, replies; and the
    same per protocol (``per_protocol``: protocol -> streams, bytes, refused, cut)."""
    protos = a.protocols or (PRE_HELLO if a.phase == "pre" else list(TALLY) + LIBP2P)
    stats: dict[str, Any] = {"protocols": protos, "identities": 0, "connected": 0, "connect_failed": 0,
                             "written": 0, "streams": 0, "refused": 0, "cut": 0, "replies": 0, "bytes": 0}
    per = {p: {"streams": 0, "bytes": 0, "refused": 0, "cut": 0} for p in protos}
    stats["per_protocol"] = per
    deadline = trio.current_time() + a.seconds
    # On two cores shared with three test workers one CI run got 6 identities through in 15 s, and every stream on
    # four of Tally's protocols was cut (the identity banned for its bombs on the first protocols) before a byte of
    # their own: the attack goes on past ``--seconds``, at most as long again, until each of Tally's protocols took
    # bytes, and each fresh identity starts with the protocols that took the fewest.
    hard_deadline = deadline + a.seconds
    cache: dict[int, dict[str, bytes]] = {}

    def going() -> bool:
        now = trio.current_time()
        return now < deadline or (now < hard_deadline and any(
            c["bytes"] == 0 for p, c in per.items() if p.startswith("/tally/")))

    def count(proto: str, key: str, n: int = 1) -> None:
        stats[key] += n
        per[proto][key] += n

    async def one(host, pid, proto: str, data: bytes, refused: list[int]) -> None:
        s = await raw_stream(host, pid, proto, timeout=min(10.0, max(0.5, hard_deadline - trio.current_time())))
        if s is None:
            count(proto, "refused")
            refused[0] += 1
            return
        count(proto, "streams")
        try:
            with trio.move_on_after(max(0.5, min(10.0, hard_deadline - trio.current_time()))):
                for off in range(0, len(data), CHUNK):
                    piece = data[off:off + CHUNK]
                    await s.write(piece)
                    count(proto, "bytes", len(piece))
                stats["written"] += 1
                if await s.read(1 << 16):
                    stats["replies"] += 1
        except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it; counted
            count(proto, "cut")
        await reset(s)

    kinds = [k for k in payloads.KINDS if not a.kinds or k in a.kinds]
    pos = dict.fromkeys(protos, 0)  # protocol -> how many of its bombs are done (carried over to the next identity)
    tries: dict[tuple[str, int], int] = {}

    async def bomber(host, pid, j: int, proto: str) -> None:
        """Protocol ``proto``'s bombs, in turn from bomb ``j`` on (so that early on every protocol gets a
        different bomb), until this identity's streams on it are refused twice running (banned) or the end."""
        size = min(TALLY.get(proto, 1 << 20), a.size)
        if size not in cache:
            cache[size] = payloads.bombs(size)
        misses = 0
        while going() and misses < 2:
            name = kinds[(j + pos[proto]) % len(kinds)]
            refused = [0]
            async with trio.open_nursery() as n:
                for _ in range(a.streams):
                    n.start_soon(one, host, pid, proto, cache[size][name], refused)
            key = (proto, pos[proto])
            tries[key] = tries.get(key, 0) + 1
            misses = misses + 1 if refused[0] == a.streams else 0
            if not misses or tries[key] >= 3:
                pos[proto] += 1  # a bomb every stream of which was refused goes again, on the next identity

    while going():
        stats["identities"] += 1
        with trio.move_on_after(max(0.0, hard_deadline - trio.current_time()) + 2.0):
            try:
                async with peer(a, hello=a.phase == "post") as (host, pid), trio.open_nursery() as n:
                    stats["connected"] += 1
                    for j, proto in sorted(enumerate(protos), key=lambda jp: per[jp[1]]["bytes"]):
                        n.start_soon(bomber, host, pid, j, proto)
            except (ConnectionError, trio.TooSlowError, OSError):
                stats["connect_failed"] += 1
                await trio.sleep(0.5)
    return stats


# ---------------------------------------------------------------------------------------------------- noread

async def noread(a: argparse.Namespace) -> dict:
    """Requests for the biggest replies the target has, on ``--streams`` streams per connection, never read.

    Reports streams opened, requests written on them and held unread (``requests``, of ``asked``; ``per_kind``:
    by kind of request: ``head`` and ``block`` of the model, snapshot ``chunk``, ``sync`` batch, ``light``
    headers), streams refused or cut before the request was written, those held to the end (``held_at_end``),
    ``kinds_asked``: the kinds it meant to request (a chunk only when the target offered a snapshot), and
    ``kinds``: those of the requests that were written."""
    stats: dict[str, Any] = {"asked": a.streams, "streams": 0, "requests": 0, "refused": 0, "kinds": [],
                             "per_kind": {}}
    async with peer(a, hello=True) as (host, pid):
        reqs: list[tuple[str, str, dict]] = []  # (kind, protocol, request)
        if a.model_id:
            mid = bytes.fromhex(a.model_id)
            reqs.append(("head", "/tally/block/1.0.0", {"model_id": mid, "type": "head"}))
            reqs.append(("block", "/tally/block/1.0.0", {"model_id": mid, "type": "block", "index": 0}))
        try:
            offer = await host.request(pid.to_base58(), "/tally/snapshot/1.0.0", {"op": "offer"}, timeout=10.0)
            if offer.get("status") == "ok":
                sid = Manifest.from_wire(offer["manifest"]).id
                reqs.append(("chunk", "/tally/snapshot/1.0.0", {"op": "chunk", "snapshot": sid, "index": 0}))
        except Exception as e:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
            stats["snapshot"] = f"{type(e).__name__}: {e}"[:120]
        reqs.append(("sync", "/tally/sync/1.0.0", {"from": 1}))
        reqs.append(("light", "/tally/snapshot/1.0.0", {"op": "light", "from": 1, "count": 64}))
        stats["kinds_asked"] = [k for k, _, _ in reqs]
        held = []
        deadline = trio.current_time() + a.seconds
        while trio.current_time() < deadline and len(held) < a.streams:
            for kind, proto, msg in reqs:
                s = await raw_stream(host, pid, proto, timeout=5.0)
                if s is None:
                    stats["refused"] += 1
                    continue
                stats["streams"] += 1
                try:
                    await write_msg(s, msg, timeout=5.0)
                    held.append(s)
                    stats["requests"] += 1
                    stats["per_kind"][kind] = stats["per_kind"].get(kind, 0) + 1
                except Exception:  # noqa: BLE001 - an attacker shrugs off however the target cuts it
                    stats["refused"] += 1
        stats["kinds"] = sorted(stats["per_kind"])
        await trio.sleep(max(0.0, deadline - trio.current_time()))
        stats["held_at_end"] = len(held)
        for s in held:
            await reset(s)
    return stats


# ---------------------------------------------------------------------------------------------------- relay

async def relay(a: argparse.Namespace) -> dict:
    """Two non-members (no hello): ``A`` reserves a slot on the target; ``B`` dials ``A`` through the target
    and pushes bytes on ``--streams`` streams for the rest of the attack.

    Reports whether the reservation was granted and the circuit opened, the streams opened through it, the bytes
    ``B`` wrote (``pushed``) and ``A`` read (``received``), and the streams cut (``cut``, ``cut_by``: the last
    reason; the relay's data limit cutting the circuit is the target defending, not an attacker's error)."""
    sink = "/tally/test/sink/1.0.0"
    stats: dict[str, Any] = {"reserved": False, "circuit": False, "streams": 0, "pushed": 0, "received": 0,
                             "cut": 0}

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
                stats["streams"] += 1
                while trio.current_time() < deadline:
                    await s.write(chunk)
                    stats["pushed"] += len(chunk)
            except Exception as e:  # noqa: BLE001 - an attacker shrugs off however the target cuts it; counted
                stats["cut"] += 1  # how (the relay's limit cutting the circuit, a refused stream): the last one
                stats["cut_by"] = f"{type(e).__name__}: {e}"[:160]

        with trio.move_on_after(max(0.0, deadline - trio.current_time())):
            async with trio.open_nursery() as n:
                for _ in range(a.streams):
                    n.start_soon(push)
    return stats


async def spin(a: argparse.Namespace) -> dict:
    """No attack: keep this process's CPU busy for ``--seconds`` (a control for the bench), sending nothing."""
    end, rounds = time.monotonic() + a.seconds, 0
    while time.monotonic() < end:
        for _ in range(10_000):
            rounds += 1
        await trio.sleep(0)
    return {"spun": rounds}


CLASSES = {"bomb": bomb, "idle": idle, "identities": identities, "noread": noread, "drip": drip, "relay": relay,
           "probe": probe, "snapserve": snapserve, "spin": spin}


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
    t0, wall0 = time.monotonic(), time.time()
    out = trio.run(CLASSES[a.cls], a)
    out["class"], out["elapsed_s"] = a.cls, round(time.monotonic() - t0, 2)
    out["t0"], out["t1"] = wall0, time.time()  # the attack itself, imports and start-up left out (wall seconds)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
