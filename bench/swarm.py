"""What a swarm of N span servers costs one node (issue 39): today's gossip announcements against the DHT records.

For each N in ``--servers`` (default 10,100,1000,10000) and each design, one measured node runs as a separate
child process of this bench (a real :class:`node.p2p.host.P2PHost`: TCP, Noise, Yamux, gossipsub, identify) and
this process drives it with what N servers would send it; the child's own figures are read from the kernel and
from the child itself:

* CPU: utime + stime of the child (``/proc/<pid>/stat``), as % of one core;
* bytes in and out per second: every byte the child's libp2p connections read and wrote (py-libp2p's TCP stream,
  counted inside the child: Noise, Yamux, multistream, pubsub and Kademlia framing included, TCP/IP headers not);
* memory: the child's VmRSS (``/proc/<pid>/status``) at the end of the point.

Each figure is printed *above an idle node*: the same child with the same design's parts started and no peer
(measured once per design, ``--seconds`` long).

``gossip`` (today's design, :mod:`node.inference.swarm`): the child subscribes to ``tally/<chain>/shards`` with
the node's handler (``node.runtime``'s ``_on_shards``: the announced addresses into the host's peerstore, then
:meth:`SwarmTable.on_announcement`; the network service's address book is left out) behind py-libp2p's
signature check. This process runs ``--mesh`` (default 6, gossipsub's D) hosts in the child's mesh and pushes,
through their gossipsub routers, N / ``ANNOUNCE_PERIOD`` announcements per second: each the exact bytes of
:meth:`SpanServer.announcement` of one of N distinct Ed25519 identities, as a pubsub message whose origin is that
identity and signed with its key (as py-libp2p's ``Pubsub.publish`` signs); each reaches the child once (through
one mesh host, in turn) and the child forwards it to the other mesh hosts as a node does. When N / 5 exceeds
``--max-rate`` messages per second, only ``max_rate * 5`` of the identities announce (each at the real period)
and the figures are scaled by N over that count: the table marks such rows ``*`` and prints the rate measured
and the factor. (A real mesh also sends the node each message from up to D-1 neighbours; only the first copy is
sent here, so gossip bytes in are understated.)

``dht`` (:mod:`node.discovery`): the child is a light client, a :class:`Discovery` in client mode joined to
``--dht-servers`` (default 16) DHT server hosts run by this process. Those hold the N servers' records, signed
(:func:`sign_record`) and put into the stores of the REPLICATION peers closest to each record's key among them,
as publishing leaves them; the N servers span ``--models`` models of 30 blocks (the client's is the first), each
span ``--span-min`` to ``--span-max`` blocks long at a random start. While the child is watched, one more host
of this process sends real ``store`` requests to the DHT servers at the rate N servers' republishing causes on
each DHT server of an N-node network: N * REPLICATION / N / ``REPUBLISH_S`` = 8 / 60 per second and server (the
light client holds nothing and receives none of it). The child's figures combine its background (a joined client
doing nothing for ``--seconds``) and route lookups (``find_route_records`` over the client's model, blocks 0-30,
after one warm-up lookup), one every ``--lookup-every`` seconds (default 60: a client that generates once a
minute, :data:`~node.inference.dhtfeed.LOOKUP_INTERVAL`). A route lookup is *warm* when its keys' closest peers
are still cached (:data:`~node.discovery.service.CLOSEST_TTL`, 120 s) and *cold* when they are found anew, one
Kademlia lookup (FIND_NODE queries) per key; a client looking up every ``lookup_every`` seconds makes a cold one
every ceil(CLOSEST_TTL / lookup_every) lookups (every other one at 60 s). ``--lookups`` warm ones and then
``--lookups`` cold ones (the cache emptied before each) are measured back to back:

    rate = background rate - idle rate + (share * cost of a cold lookup + (1 - share) * cost of a warm one)
                                          / lookup_every,   share = 1 / ceil(CLOSEST_TTL / lookup_every)

(Measuring warm lookups alone, as this bench once did, left out the Kademlia lookups, ~90 % of a client's bytes,
and let their share depend on N: with more than ``ROUTE_LIMIT`` records under a key each answer is a random sample,
so the positions a lookup reaches differ from the warm-up's and some are cold, while at 100 servers every answer
is whole and the same, so none is.) Each dht note also breaks a warm lookup's, a cold lookup's and the
background's bytes (in + out) down by libp2p stream protocol (payload bytes of the streams, counted in the child;
``negotiation``: multistream-select before a protocol is agreed; ``Noise/Yamux/handshakes``: what the connections
carried beyond the streams' payloads) and counts connections opened and Kademlia lookups.

Printed: one row per N with both designs side by side (CPU % of a core, kB/s in and out, MB of RSS, all above
idle), the ratio of 10,000 (or the largest N) to 100 (or the smallest) for each figure, and issue 39's check 1 on
the DHT client's figures (growth <= 1.5x from 100 to 10,000 servers, beyond the measurement resolution printed with
it; at 10,000: <= 2 % of a core, <= 20 kB/s in + out, <= 100 MB). Compare designs within one run; the machine's
load changes what a CPU-second buys.

Limits: the DHT servers and the mesh are simulated peers in this process (the child's side is all real); a
network of N DHT servers has more hops per lookup (log2(N / 8) rounds, against one or two among 16 servers) and
dials new peers, so its lookups cost more messages and handshakes than here; the gossip child has ``--mesh``
peers, a node has more connections.

Usage: ``.venv/bin/python bench/swarm.py [--servers 10,100,1000,10000] [--seconds 30] [--designs gossip,dht]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trio

from node.discovery.keys import span_key
from node.discovery.record import SpanRecord, sign_record
from node.discovery.service import CLOSEST_TTL, DISCOVERY_PROTOCOL, REPLICATION, Discovery, Mode
from node.encoding import DecodeError, H, pack, unpack
from node.identity import Identity
from node.inference.server import ANNOUNCE_PERIOD, SpanServer
from node.inference.swarm import SwarmTable
from node.p2p.host import P2PHost, libp2p_keypair

CLK = os.sysconf("SC_CLK_TCK")
CHAIN = "bench-swarm"
BLOCKS = 30  # blocks of every simulated model
REPUBLISH_S = 60.0  # seconds between a server's record republications (node.discovery.publisher, Petals' 60 s)
RECORD_LIFE = 600  # seconds the simulated records stay valid (they outlive the run)
TARGETS = {"cpu": 2.0, "bytes": 20.0, "rss": 100.0}  # check 1 at 10,000 servers: % of a core, kB/s, MB
GROWTH = 1.5  # check 1: growth allowed from 100 to 10,000 servers
# measurement resolution, added to the allowed growth: /proc's CPU clock is 1/CLK s per read, RSS moves by ~1 MB
RSS_RES_MB = 2.0
BYTES_RES_KBS = 0.1


# ---------------------------------------------------------------------------------------------- the measured node

def count_tcp_bytes(counts: dict[str, int]) -> None:
    """Count every byte py-libp2p's TCP streams read and write in this process into ``counts["in"/"out"]``."""
    from libp2p.io.trio import TrioTCPStream

    read, write = TrioTCPStream.read, TrioTCPStream.write

    async def counted_read(self: TrioTCPStream, n: int | None = None) -> bytes:
        data = await read(self, n)
        counts["in"] += len(data)
        return data

    async def counted_write(self: TrioTCPStream, data: bytes) -> None:
        await write(self, data)
        counts["out"] += len(data)

    TrioTCPStream.read = counted_read  # type: ignore[method-assign]  # the counter itself (same signature)
    TrioTCPStream.write = counted_write  # type: ignore[method-assign]  # the counter itself (same signature)


def count_stream_bytes(counts: dict[str, int]) -> None:
    """Count the payload bytes of every libp2p stream in this process by the stream's protocol id into
    ``counts["p:<protocol>"]`` (``p:negotiation`` before multistream-select settled one): Noise, Yamux and the
    handshakes are what the TCP count holds beyond their sum."""
    from libp2p.network.stream.net_stream import NetStream

    read, write = NetStream.read, NetStream.write

    def add(stream: NetStream, n: int) -> None:
        key = "p:" + str(stream.get_protocol() or "negotiation")
        counts[key] = counts.get(key, 0) + n

    async def counted_read(self: NetStream, n: int | None = None) -> bytes:
        data = await read(self, n)
        add(self, len(data))
        return data

    async def counted_write(self: NetStream, data: bytes) -> None:
        await write(self, data)
        add(self, len(data))

    NetStream.read = counted_read  # type: ignore[method-assign]  # the counter itself (same signature)
    NetStream.write = counted_write  # type: ignore[method-assign]  # the counter itself (same signature)


def count_record_bytes(host: P2PHost, counts: dict[str, int]) -> None:
    """Count the bytes of the span records in ``host``'s ``/tally/discovery/1.0.0`` replies into
    ``counts["records"]`` (the rest of a lookup's bytes are Kademlia's, framing and the connection's)."""
    request = host.request

    async def counted(peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int | None = None) -> dict[str, Any]:
        reply = await request(peer_id, protocol_id, msg, timeout, max_message)
        if protocol_id == DISCOVERY_PROTOCOL and isinstance(reply.get("records"), list):
            counts["records"] += sum(len(r) for r in reply["records"] if isinstance(r, bytes))
        return reply

    host.request = counted  # type: ignore[method-assign]  # the counter itself (same signature)


def shards_handler(host: P2PHost, swarm: SwarmTable, handled: list[int]) -> Callable[[bytes, str], Any]:
    """The node's ``tally/<chain>/shards`` handler (``node.runtime``'s ``_on_shards``) without the network
    service's address book: a message naming its sender puts the sender's direct addresses into the host's
    peerstore, then goes to :meth:`SwarmTable.on_announcement`."""

    async def on_shards(data: bytes, from_peer: str) -> None:
        handled[0] += 1
        try:
            msg = unpack(data, max_size=1 << 14)
        except DecodeError:
            return
        if isinstance(msg, dict) and from_peer in (msg.get("presence"), msg.get("peer")):
            addrs = msg.get("addrs")
            if isinstance(addrs, list):
                mine = [a for a in addrs[:16] if isinstance(a, str) and a.endswith("/p2p/" + from_peer)]
                host.remember([a for a in mine if "/p2p-circuit" not in a])
        await swarm.on_announcement(data, from_peer)

    return on_shards


async def _lines(stream: Any) -> AsyncIterator[str]:
    buf = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def child_main(design: str) -> None:
    """The measured node: a host with the parts of ``design`` (``gossip`` or ``dht``); answers one JSON line per
    command line on stdin: ``stats``, ``connect <addr>...``, ``lookup <model hex> <start> <end> [cold]``
    (``cold``: the closest peers of every key looked up again, as once their cache has expired), ``quit``."""
    counts = {"in": 0, "out": 0, "records": 0, "conns": 0, "kad_lookups": 0}
    count_tcp_bytes(counts)
    count_stream_bytes(counts)
    host = P2PHost(Identity.generate(), 0, CHAIN)

    def connected(_peer: str, _conn: Any) -> None:
        counts["conns"] += 1

    host.on_connected.append(connected)
    swarm, handled = SwarmTable(), [0]
    disc: Discovery | None = None
    async with host.running():
        if design == "gossip":
            await host.subscribe(host.topic("shards"), shards_handler(host, swarm, handled))
        else:
            disc = Discovery(host, Mode.CLIENT)
            await host.start_service(disc.run)
            count_record_bytes(host, counts)
            await disc.ready.wait()
            routing = disc.dht.peer_routing
            lookup_net = routing.find_closest_peers_network

            async def counted_lookup(*a: Any, **kw: Any) -> Any:
                counts["kad_lookups"] += 1
                return await lookup_net(*a, **kw)

            routing.find_closest_peers_network = counted_lookup
        _reply({"peer": host.peer_id, "addrs": host.addrs})
        async for line in _lines(trio.lowlevel.FdStream(os.dup(0))):
            cmd, *args = line.split()
            if cmd == "stats":
                _reply({**counts, "handled": handled[0], "open": len(host.connected_peers()),
                        "entries": len(swarm.entries), "mesh": len(host.mesh_peers(host.topic("shards"))),
                        "routing": disc.routing_table_size() if disc else 0})
            elif cmd == "connect":
                n = await host.connect(args)
                if disc is not None:
                    with trio.fail_after(20):
                        for peer in {a.rsplit("/p2p/", 1)[1] for a in args}:
                            while not await disc.add_peer(peer):  # identify has not stored its protocols yet
                                await trio.sleep(0.05)
                _reply({"connected": n})
            elif cmd == "lookup" and disc is not None:
                if args[3:] == ["cold"]:  # as when the closest peers' cache (CLOSEST_TTL) has run out
                    disc._closest.clear()
                sent = disc.counters.sent
                recs = await disc.find_route_records(bytes.fromhex(args[0]), int(args[1]), int(args[2]))
                _reply({"records": len(recs), "requests": disc.counters.sent - sent})
            elif cmd == "quit":
                _reply({})
                return


class Child:
    """The measured node's process, driven over its stdin/stdout."""

    def __init__(self, proc: trio.Process, design: str):
        self.proc, self.design = proc, design
        self._lines = _lines(proc.stdout)
        self.info: dict[str, Any] = {}

    @classmethod
    async def start(cls, design: str, log: Path) -> Child:
        with open(log, "ab") as err:
            proc = await trio.lowlevel.open_process(
                [sys.executable, str(Path(__file__).resolve()), "--child", design],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        child = cls(proc, design)
        with trio.fail_after(60):
            child.info = json.loads(await child._lines.__anext__())
        return child

    async def ask(self, line: str, timeout: float = 120.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all((line + "\n").encode())
        with trio.fail_after(timeout):
            reply: dict[str, Any] = json.loads(await self._lines.__anext__())
        return reply

    def cpu(self) -> float:
        """utime + stime of the process in seconds (``/proc/<pid>/stat`` fields 14 and 15)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    async def stop(self) -> None:
        with trio.move_on_after(10):
            await self.ask("quit")
            await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@dataclass
class Window:
    """What the child did over one watched window: CPU seconds, bytes in and out, messages handled, seconds."""

    cpu: float
    bytes_in: int
    bytes_out: int
    handled: int
    seconds: float
    records: int = 0  # bytes of span records in discovery replies
    detail: dict[str, int] = field(default_factory=dict)  # p:<protocol> stream bytes, conns opened, kad_lookups


@asynccontextmanager
async def watching(child: Child) -> AsyncIterator[list[Window]]:
    """Yield a list that holds, after the block, the child's :class:`Window` over the block."""
    out: list[Window] = []
    s0, c0, t0 = await child.ask("stats"), child.cpu(), time.monotonic()
    yield out
    s1, c1, t1 = await child.ask("stats"), child.cpu(), time.monotonic()
    detail = {k: v - s0.get(k, 0) for k, v in s1.items()
              if (k.startswith("p:") or k in ("conns", "kad_lookups")) and v != s0.get(k, 0)}
    out.append(Window(c1 - c0, s1["in"] - s0["in"], s1["out"] - s0["out"], s1["handled"] - s0["handled"], t1 - t0,
                      s1["records"] - s0["records"], detail))


@dataclass
class Figures:
    """One point's figures above idle: CPU % of a core, kB/s in and out, MB of RSS; ``note``: how they were had."""

    cpu: float
    kbs_in: float
    kbs_out: float
    rss: float
    note: str = ""
    scaled: bool = False


def breakdown(w: Window, per: float) -> str:
    """``w``'s bytes (in + out) divided by ``per``, in kB, by stream protocol (``Noise/Yamux/handshakes``: what
    the connections carried beyond the streams' payloads), then connections opened and Kademlia lookups."""
    streams = {k[2:]: v for k, v in w.detail.items() if k.startswith("p:")}
    parts = sorted(streams.items(), key=lambda kv: -kv[1])
    parts.append(("Noise/Yamux/handshakes", w.bytes_in + w.bytes_out - sum(streams.values())))
    text = ", ".join(f"{k} {v / per / 1000:.1f}" for k, v in parts)
    return (f"{text} kB; {w.detail.get('conns', 0) / per:.1f} connections opened, "
            f"{w.detail.get('kad_lookups', 0) / per:.1f} Kademlia lookups")


# ---------------------------------------------------------------------------------------------- idle baselines

async def idle(design: str, seconds: float, log: Path) -> tuple[Window, float]:
    """The child with ``design``'s parts and no peer: its :class:`Window` over ``seconds`` and its RSS (MB)."""
    child = await Child.start(design, log)
    try:
        await trio.sleep(min(1.0, seconds))
        async with watching(child) as w:
            await trio.sleep(seconds)
        return w[0], child.rss_mb()
    finally:
        await child.stop()


# ---------------------------------------------------------------------------------------------- gossip design

@dataclass
class SimServer:
    """One simulated span server of the gossip design: its libp2p key, origin id and announcement stand-in."""

    key: Any  # libp2p Ed25519PrivateKey
    pub: bytes  # serialized libp2p public key (the pubsub message's ``key`` field)
    from_id: bytes  # libp2p peer id bytes (the pubsub message's ``from`` field)
    server: SpanServer  # a stand-in holding what SpanServer.announcement reads
    addrs: list[str]


def sim_servers(n: int, rng: random.Random) -> list[SimServer]:
    """``n`` distinct identities, each serving a span of the first model."""
    from libp2p.peer.id import ID

    model = model_id(0)
    out = []
    for i in range(n):
        ident = Identity.generate()
        kp = libp2p_keypair(ident)
        start, end = random_span(rng)
        stand_in = SimpleNamespace(
            ident=ident, span=SimpleNamespace(model_id=model, start=start, end=end), active=rng.randrange(0, 4),
            stats=SimpleNamespace(throughput=rng.uniform(5, 50), latency=rng.uniform(0.02, 0.3)),
            free_cache=rng.randrange(1000, 100_000))
        out.append(SimServer(kp.private_key, kp.public_key.serialize(), ID.from_pubkey(kp.public_key).to_bytes(),
                             cast(SpanServer, stand_in), [sim_addr(i, ident.peer_id)]))
    return out


def signed_message(s: SimServer, topic: str, seq: int, seqno: int) -> Any:
    """The pubsub message ``s`` would publish: its announcement, origin ``s``, signed with ``s``'s key exactly as
    py-libp2p's ``Pubsub.publish`` signs (``PUBSUB_SIGNING_PREFIX`` + the serialized message)."""
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX

    data = pack(SpanServer.announcement(s.server, s.addrs, seq, ANNOUNCE_PERIOD))
    msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=s.from_id, seqno=seqno.to_bytes(8, "big"))
    msg.signature = s.key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key = s.pub
    return msg


async def announce(mesh: list[P2PHost], servers: list[SimServer], sent: list[int]) -> None:
    """Every simulated server announces once per ``ANNOUNCE_PERIOD``, spread evenly, each message pushed
    through one mesh host's gossipsub router in turn (as a forwarded message); runs until cancelled."""
    topic = mesh[0].topic("shards")
    routers = [h._running_gossip()._pubsub for h in mesh]
    rate = len(servers) / ANNOUNCE_PERIOD
    seqno, t0 = time.time_ns(), trio.current_time()
    seq0 = int(time.time() * 1000)
    i = 0
    while True:
        due = int((trio.current_time() - t0) * rate) + 1
        while i < due:
            s = servers[i % len(servers)]
            pubsub = routers[i % len(routers)]
            seqno += 1
            await pubsub.router.publish(pubsub.my_id, signed_message(s, topic, seq0 + i // len(servers), seqno))
            i += 1
            sent[0] = i
            if i % 16 == 0:
                await trio.sleep(0)
        await trio.sleep_until(t0 + i / rate)


async def gossip_point(n: int, args: argparse.Namespace, base: tuple[Window, float], log: Path) -> Figures:
    """Today's design at ``n`` servers (module docstring)."""
    sim = min(n, max(1, int(args.max_rate * ANNOUNCE_PERIOD)))
    servers = sim_servers(sim, random.Random(args.seed))
    child = await Child.start("gossip", log)
    try:
        async with AsyncExitStack() as stack:
            mesh = [P2PHost(Identity.generate(), 0, CHAIN) for _ in range(args.mesh)]
            for h in mesh:
                await stack.enter_async_context(h.running())
                h._running_gossip()._pubsub.strict_signing = False  # the driver skips checking what comes back

                async def drop(_data: bytes, _peer: str) -> None:
                    return None

                await h.subscribe(h.topic("shards"), drop)
                assert await h.connect(child.info["addrs"]) == 1
            with trio.fail_after(30):
                for h in mesh:
                    await h.wait_for_topic_peers(h.topic("shards"), 1, timeout=30)
                while (await child.ask("stats"))["mesh"] < min(args.mesh, 6):
                    await trio.sleep(0.1)
            sent = [0]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(announce, mesh, servers, sent)
                await trio.sleep(args.settle)
                sent0 = sent[0]
                async with watching(child) as w:
                    await trio.sleep(args.seconds)
                sent1 = sent[0]
                nursery.cancel_scope.cancel()
            rss = child.rss_mb()
            stats = await child.ask("stats")
    finally:
        await child.stop()
    win, (idle_w, idle_rss) = w[0], base
    offered, rate = sim / ANNOUNCE_PERIOD, win.handled / win.seconds
    scale = (n / ANNOUNCE_PERIOD) / rate if rate > 0 else math.inf
    cpu = (win.cpu / win.seconds - idle_w.cpu / idle_w.seconds) * 100
    kin = (win.bytes_in / win.seconds - idle_w.bytes_in / idle_w.seconds) / 1000
    kout = (win.bytes_out / win.seconds - idle_w.bytes_out / idle_w.seconds) / 1000
    note = (f"gossip {n:>6}: {sim} identities announcing, {offered:.0f} msg/s offered, "
            f"{(sent1 - sent0) / win.seconds:.0f}/s pushed, {rate:.0f}/s handled by the node "
            f"(table: {stats['entries']} servers); measured CPU {cpu:.2f} %, in {kin:.2f} kB/s, out {kout:.2f} kB/s, "
            f"RSS +{rss - idle_rss:.1f} MB")
    scaled = sim < n or rate < 0.9 * offered  # capped, or the node (or this driver) fell behind
    if scaled:
        note += f"; scaled x{scale:.2f} to {n / ANNOUNCE_PERIOD:.0f} msg/s (RSS too: a linear estimate)"
    s = scale if scaled else 1.0
    return Figures(cpu * s, kin * s, kout * s, (rss - idle_rss) * s, note, scaled)


# ---------------------------------------------------------------------------------------------- DHT design

def model_id(m: int) -> bytes:
    return H(b"bench-swarm-model", m.to_bytes(4, "big"))


def random_span(rng: random.Random, lo: int = 4, hi: int = 12) -> tuple[int, int]:
    length = rng.randint(lo, hi)
    start = rng.randint(0, BLOCKS - length)
    return start, start + length


def sim_addr(i: int, peer: str) -> str:
    return f"/ip4/{44 + i // 65536 % 100}.{i // 256 % 256}.{i % 256}.{7 + i % 200}/tcp/4001/p2p/{peer}"


def sim_records(n: int, args: argparse.Namespace) -> list[SpanRecord]:
    """The records of ``n`` servers spread over ``args.models`` models (server ``i`` serves model ``i % models``)."""
    rng = random.Random(args.seed)
    expires = int(time.time()) + RECORD_LIFE
    out = []
    for i in range(n):
        ident = Identity.generate()
        start, end = random_span(rng, args.span_min, args.span_max)
        out.append(sign_record(ident, model_id(i % args.models), start, end, throughput=rng.uniform(5, 50),
                               latency=rng.uniform(0.02, 0.3), free_cache=rng.randrange(1000, 100_000),
                               addrs=(sim_addr(i, ident.peer_id),), seq=1, expires=expires))
    return out


def place(discs: list[Discovery], records: list[SpanRecord]) -> None:
    """Put each record into the stores of the REPLICATION servers closest to its key (Kademlia's XOR metric,
    py-libp2p's own ordering), emptying them first."""
    from libp2p.kad_dht.utils import sort_peer_ids_by_distance
    from libp2p.peer.id import ID

    ids = {ID.from_base58(d.host.peer_id): d for d in discs}
    now = time.time()
    for d in discs:
        d.store = type(d.store)()
    closest: dict[bytes, list[Discovery]] = {}
    for r in records:
        key = span_key(r.model_id, r.start)
        if key not in closest:
            closest[key] = [ids[p] for p in sort_peer_ids_by_distance(key, list(ids))[:REPLICATION]]
        for d in closest[key]:
            d.store.put(r, now)


async def republish(publisher: P2PHost, servers: list[str], rate: float) -> None:
    """Real ``store`` requests from ``publisher`` (its own record, a fresh one each time) to ``servers`` in turn,
    ``rate`` per second in all; runs until cancelled."""
    rng, seq, i = random.Random(0), 1, 0
    while True:
        seq += 1
        start, end = random_span(rng)
        rec = sign_record(publisher.identity, model_id(0), start, end, seq=seq, expires=int(time.time()) + 180,
                          addrs=tuple(publisher.addrs[:1]))
        try:
            await publisher.request(servers[i % len(servers)], DISCOVERY_PROTOCOL, {"op": "store",
                                                                                   "record": rec.encode()}, 5.0)
        except Exception as e:  # noqa: BLE001 - a store lost is no failure of the bench; counted in the log
            print(f"republish: {type(e).__name__}: {e}", file=sys.stderr)
        i += 1
        await trio.sleep(1 / rate)


@asynccontextmanager
async def dht_servers(count: int) -> AsyncIterator[tuple[list[Discovery], list[P2PHost], P2PHost]]:
    """``count`` DHT server hosts, all connected and in each other's routing tables, and one publisher host
    connected to them all."""
    async with AsyncExitStack() as stack:
        hosts = [P2PHost(Identity.generate(), 0, CHAIN) for _ in range(count + 1)]
        for h in hosts:
            await stack.enter_async_context(h.running())
        servers, publisher = hosts[:count], hosts[count]
        discs = [Discovery(h, Mode.SERVER) for h in servers]
        nursery = await stack.enter_async_context(trio.open_nursery())
        for d in discs:
            await nursery.start(d.run)
        for i, h in enumerate(servers):
            for o in servers[:i]:
                assert await h.connect(o.addrs) == 1
        for h in servers:
            assert await publisher.connect(h.addrs) == 1

        async def adopt(d: Discovery, peer: str) -> None:
            while not await d.add_peer(peer):  # identify has not stored the peer's protocols yet
                await trio.sleep(0.05)

        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                for d in discs:
                    for o in servers:
                        if o is not d.host:
                            n.start_soon(adopt, d, o.peer_id)
        yield discs, servers, publisher
        nursery.cancel_scope.cancel()


def cold_share(every: float) -> float:
    """The share of a client's route lookups, one every ``every`` seconds, that find their keys' closest peers
    anew: a key's closest peers are reused for CLOSEST_TTL seconds, so one lookup in ceil(CLOSEST_TTL / every)."""
    return 1 / max(1, math.ceil(CLOSEST_TTL / every))


async def dht_point(n: int, args: argparse.Namespace, base: tuple[Window, float], discs: list[Discovery],
                    hosts: list[P2PHost], publisher: P2PHost, log: Path) -> Figures:
    """The DHT design at ``n`` servers (module docstring)."""
    place(discs, sim_records(n, args))
    rate = len(discs) * REPLICATION / REPUBLISH_S  # N * REPLICATION / N DHT servers / REPUBLISH_S, per server
    child = await Child.start("dht", log)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(republish, publisher, [h.peer_id for h in hosts], rate)
            await child.ask("connect " + " ".join(h.addrs[0] for h in hosts[:3]))
            lookup = f"lookup {model_id(0).hex()} 0 {BLOCKS}"
            warm = await child.ask(lookup)
            await trio.sleep(min(1.0, args.seconds))
            async with watching(child) as bg:
                await trio.sleep(args.seconds)
            found = []
            async with watching(child) as lk:
                for _ in range(args.lookups):
                    found.append(await child.ask(lookup))
            async with watching(child) as cold_w:
                for _ in range(args.lookups):
                    found.append(await child.ask(lookup + " cold"))
            rss = child.rss_mb()
            routing = (await child.ask("stats"))["routing"]
            nursery.cancel_scope.cancel()
    finally:
        await child.stop()
    (b, k, c), (idle_w, idle_rss) = (bg[0], lk[0], cold_w[0]), base
    per, lookups = float(args.lookup_every), int(args.lookups)
    cold = cold_share(per)

    def rate_of(bg_x: float, lk_x: float, cold_x: float, idle_x: float) -> float:
        return bg_x / b.seconds - idle_x / idle_w.seconds + (cold * cold_x + (1 - cold) * lk_x) / lookups / per

    cpu = rate_of(b.cpu, k.cpu, c.cpu, idle_w.cpu) * 100
    kin = rate_of(b.bytes_in, k.bytes_in, c.bytes_in, idle_w.bytes_in) / 1000
    kout = rate_of(b.bytes_out, k.bytes_out, c.bytes_out, idle_w.bytes_out) / 1000

    def one(w: Window, name: str, i: int) -> str:
        return (f"{name} {w.seconds / lookups * 1000:.0f} ms, {w.cpu / lookups * 1000:.0f} ms CPU, "
                f"{w.bytes_in / lookups / 1000:.1f} kB in (records {w.records / lookups / 1000:.1f} kB), "
                f"{w.bytes_out / lookups / 1000:.1f} kB out, {found[i]['records']} records in "
                f"{found[i]['requests']} find requests")

    note = (f"dht    {n:>6}: {sum(len(d.store) for d in discs)} records held by {len(discs)} DHT servers; "
            f"a route lookup (warm-up: {warm['records']} records): {one(k, 'warm', lookups - 1)}; "
            f"{one(c, 'cold', -1)}; a cold one every {1 / cold:.0f} (CLOSEST_TTL {CLOSEST_TTL:g} s, one lookup "
            f"every {per:g} s); background {(b.cpu / b.seconds - idle_w.cpu / idle_w.seconds) * 100:.2f} % CPU, "
            f"{b.bytes_in / b.seconds / 1000:.2f} kB/s in, {b.bytes_out / b.seconds / 1000:.2f} kB/s out; "
            f"routing table {routing}\n"
            f"         per warm lookup (in + out): {breakdown(k, lookups)}\n"
            f"         per cold lookup (in + out): {breakdown(c, lookups)}\n"
            f"         background, per {b.seconds:.0f} s: {breakdown(b, 1.0)}")
    return Figures(cpu, kin, kout, rss - idle_rss, note)


# ---------------------------------------------------------------------------------------------- report

def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def report(results: dict[tuple[str, int], Figures], ns: list[int], designs: list[str], seconds: float) -> str:
    lines = [f"{'servers':>8} | " + " | ".join(f"{d + (' (today)' if d == 'gossip' else ' (light client)'):^40}"
                                                for d in designs),
             f"{'':>8} | " + " | ".join(f"{'CPU %':>8} {'in kB/s':>9} {'out kB/s':>9} {'RSS MB':>9}"
                                        for _ in designs)]
    for n in ns:
        cells = []
        for d in designs:
            f = results[(d, n)]
            cells.append(f"{f.cpu:8.2f} {f.kbs_in:9.2f} {f.kbs_out:9.2f} {f.rss:9.1f}{'*' if f.scaled else ' '}")
        lines.append(f"{n:>8} | " + " | ".join(cells))
    if any(f.scaled for f in results.values()):
        lines.append("  * gossip at the rate measured, scaled linearly to N / 5 messages/s (notes above)")
    lo, hi = (100, 10_000) if {100, 10_000} <= set(ns) else (min(ns), max(ns))
    if lo != hi:
        for d in designs:
            a, b = results[(d, hi)], results[(d, lo)]
            lines.append(f"{d:>6} {hi} / {lo}: CPU {_ratio(a.cpu, b.cpu)}, in {_ratio(a.kbs_in, b.kbs_in)}, "
                         f"out {_ratio(a.kbs_out, b.kbs_out)}, RSS {_ratio(a.rss, b.rss)}")
    if "dht" in designs and lo != hi:
        lines.append(check(results[("dht", lo)], results[("dht", hi)], lo, hi, seconds))
    return "\n".join(lines)


def check(lo_f: Figures, hi_f: Figures, lo: int, hi: int, seconds: float) -> str:
    """Issue 39's check 1 on the DHT client's figures: growth from ``lo`` to ``hi`` servers within GROWTH (plus
    the measurement resolution, printed), and the absolute targets at ``hi``."""
    cpu_res = 2 * 100 / CLK / seconds  # two clock ticks over the window, % of a core
    rows = []
    for name, a, b, res, target, unit in (
            ("CPU", hi_f.cpu, lo_f.cpu, cpu_res, TARGETS["cpu"], "% of a core"),
            ("bytes in + out", hi_f.kbs_in + hi_f.kbs_out, lo_f.kbs_in + lo_f.kbs_out, BYTES_RES_KBS,
             TARGETS["bytes"], "kB/s"),
            ("RSS", hi_f.rss, lo_f.rss, RSS_RES_MB, TARGETS["rss"], "MB")):
        grows = a <= GROWTH * max(b, 0.0) + res
        rows.append(f"  {'MET    ' if grows else 'NOT MET'} dht client {name} from {lo} to {hi} servers grows "
                    f"<= {GROWTH}x (+{res:.2f} {unit} resolution): {b:.2f} -> {a:.2f} {unit}")
        rows.append(f"  {'MET    ' if a <= target else 'NOT MET'} dht client {name} at {hi} servers <= {target:g} "
                    f"{unit} above idle: {a:.2f}")
    if hi != 10_000 or lo != 100:
        rows.append(f"  (issue 39 names 100 and 10000 servers; this run's ends are {lo} and {hi})")
    return "check 1 (issue 39, the DHT light client):\n" + "\n".join(rows)


async def sweep(args: argparse.Namespace, ns: list[int], designs: list[str], log: Path) -> None:
    results: dict[tuple[str, int], Figures] = {}
    base = {d: await idle(d, args.seconds, log) for d in designs}
    for d, (w, rss) in base.items():
        print(f"idle {d:6}: {w.cpu / w.seconds * 100:.2f} % CPU, {w.bytes_in / w.seconds:.0f} B/s in, "
              f"{w.bytes_out / w.seconds:.0f} B/s out, RSS {rss:.1f} MB", flush=True)
    if "gossip" in designs:
        for n in ns:
            results[("gossip", n)] = f = await gossip_point(n, args, base["gossip"], log)
            print(f.note, flush=True)
    if "dht" in designs:
        async with dht_servers(args.dht_servers) as (discs, hosts, publisher):
            for n in ns:
                results[("dht", n)] = f = await dht_point(n, args, base["dht"], discs, hosts, publisher, log)
                print(f.note, flush=True)
    print(report(results, ns, designs, args.seconds), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Output: see the module docstring (bench/swarm.py).")
    ap.add_argument("--servers", default="10,100,1000,10000", help="comma-separated swarm sizes N")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds watched per point (and per idle baseline)")
    ap.add_argument("--designs", default="gossip,dht", help="comma-separated: gossip, dht")
    ap.add_argument("--max-rate", type=float, default=200.0,
                    help="gossip messages/s pushed at most; above, figures are scaled (default 200)")
    ap.add_argument("--mesh", type=int, default=6, help="gossip: driver hosts in the node's mesh (default 6)")
    ap.add_argument("--settle", type=float, default=ANNOUNCE_PERIOD,
                    help="gossip: seconds of traffic before watching (default one announce period)")
    ap.add_argument("--dht-servers", type=int, default=16, help="dht: DHT server hosts (default 16)")
    ap.add_argument("--models", type=int, default=1, help="dht: models the N servers serve (default 1: all serve "
                                                          "the client's, the client's worst case)")
    ap.add_argument("--span-min", type=int, default=4, help="dht: shortest span in blocks (default 4)")
    ap.add_argument("--span-max", type=int, default=12, help="dht: longest span in blocks (default 12)")
    ap.add_argument("--lookups", type=int, default=3, help="dht: route lookups measured per point (default 3)")
    ap.add_argument("--lookup-every", type=float, default=60.0,
                    help="dht: seconds between a client's route lookups (default 60)")
    ap.add_argument("--seed", type=int, default=1, help="spans and measurements of the simulated servers")
    ap.add_argument("--log", type=Path, help="the measured nodes' stderr (default: a temporary file)")
    ap.add_argument("--child", choices=("gossip", "dht"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        trio.run(child_main, args.child)
        return
    ns = [int(x) for x in args.servers.split(",") if x]
    designs = [d for d in args.designs.split(",") if d]
    if not ns or any(x < 1 for x in ns) or not set(designs) <= {"gossip", "dht"} or not designs:
        ap.error("--servers takes positive integers, --designs gossip and/or dht")
    log = args.log or Path(os.environ.get("TMPDIR", "/tmp")) / f"tally-swarm-{os.getpid()}.log"
    print(f"bench/swarm.py: N = {ns}, {args.seconds:g} s per point, designs {designs}; nodes' stderr in {log}",
          flush=True)
    trio.run(sweep, args, ns, designs, log)


if __name__ == "__main__":
    main()
