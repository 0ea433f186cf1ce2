"""Span discovery over libp2p: Kademlia finds the peers closest to a key, Tally's own protocol stores and fetches
the signed records there (I/O edge of :mod:`node.discovery`).

py-libp2p's ``KadDHT`` gives the routing table and the iterative lookup of the peers closest to a key (O(log n)
hops: Maymounkov & Mazières 2002, section 2.3); its value store holds one value per key, and its provider records
carry no span, so the records themselves travel on ``/tally/discovery/1.0.0``:

- ``{"op": "store", "record": bytes}``: the sender stores its own record (a record of another server is refused:
  nobody holds a place in another's name). Reply ``{"held": bool}``.
- ``{"op": "find", "key": 32 bytes, "limit": n}``: reply ``{"records": [bytes, ...]}`` (at most
  :data:`~node.discovery.store.ANSWER_LIMIT`).

Every record read is checked (:func:`~node.discovery.record.decode_record`) before it is used; a peer that
answers with a bad one is penalized. Requests and replies are bounded by the wire-limit table and have deadlines.
A node in client mode (a light client) runs the lookup but holds no records and answers no requests: its cost is
what it asks for.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import trio

from ..keys import account_to_str
from ..p2p.framing import FrameError, RemoteError, RequestTimeout, StreamClosed
from ..p2p.streams import PeerUnreachable
from .keys import span_key
from .record import RecordError, SpanRecord, decode_record
from .store import ANSWER_LIMIT, RecordStore

DISCOVERY_PROTOCOL = "/tally/discovery/1.0.0"
REPLICATION = 8  # peers closest to a key that hold each record (Kademlia's k is 20; records are republished)
REQUEST_TIMEOUT = 5.0  # seconds for one store or find exchange
ASK_AT_ONCE = 2  # replicas a find asks (nearest first, one at a time) unless one answer is already full
ROUTE_LIMIT = 8  # records a route lookup asks for per position (a route needs a few candidates, not all)
CLOSEST_TTL = 120.0  # seconds a key's closest peers are reused before the next iterative lookup
MAX_CLOSEST_KEYS = 1024  # keys whose closest peers are remembered (oldest forgotten first)
ADOPT_TRIES, ADOPT_GAP = 10, 0.2  # a new connection's peer joins the routing table once identify knows it
MAX_ADOPTING = 64  # connections whose peers are being adopted at once; beyond, a peer waits for its next one
BAD_RECORD = 5.0  # penalty weight for a peer that sends a record that does not check

log = logging.getLogger("tally.discovery")
REQUEST_ERRORS = (PeerUnreachable, RemoteError, RequestTimeout, StreamClosed, FrameError)


class Mode(Enum):
    """A node's part in the DHT: a server holds records and answers; a client only asks."""

    SERVER = "server"
    CLIENT = "client"


class DiscoveryHost(Protocol):
    """What discovery needs of the host (:class:`node.p2p.host.P2PHost`)."""

    @property
    def peer_id(self) -> str: ...

    @property
    def libp2p(self) -> Any: ...

    def set_request_handler(self, protocol_id: str, fn: Any, timeout: float | None = None,
                            max_message: int | None = None) -> None: ...

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int | None = None) -> dict[str, Any]: ...

    def penalize(self, peer_id: str, weight: float, ban_s: float | None = None) -> bool: ...

    @property
    def on_connected(self) -> list[Callable[[str, Any], None]]: ...

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None: ...


@dataclass
class Counters:
    """What a node's discovery did: requests served and sent, records refused (for benches and ``node peers``)."""

    served_store: int = 0
    served_find: int = 0
    sent: int = 0
    bad_records: int = 0


class Discovery:
    """Publish this node's span records and find other servers' (one per node; :meth:`run` while the host runs).

    Args:
        host: the running host. mode: :class:`Mode`. store: the records held (server mode).
        clock: Unix seconds (records carry absolute expiries). rng: peer sampling.
        replication: peers closest to a key that hold each record (default :data:`REPLICATION`).
    """

    def __init__(self, host: DiscoveryHost, mode: Mode = Mode.SERVER, store: RecordStore | None = None,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 replication: int = REPLICATION):
        self.host, self.mode, self.replication = host, mode, replication
        self.store = store or RecordStore()
        self.clock = clock
        self.rng = rng or random.Random()
        self.dht: Any = None
        self.counters = Counters()
        self.ready = trio.Event()
        self._closest: OrderedDict[bytes, tuple[float, list[str]]] = OrderedDict()  # key -> (trio time, peers)
        if mode is Mode.SERVER:
            host.set_request_handler(DISCOVERY_PROTOCOL, self._serve)

    # ------------------------------------------------------------------ the DHT's routing

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run py-libp2p's Kademlia routing on the host until cancelled (``task_status.started()`` once up)."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL
        from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
        from libp2p.tools.anyio_service import background_trio_service

        class ServersOnlyDHT(KadDHT):
            """py-libp2p adds to the routing table any peer that opens a Kademlia stream (kad_dht.py
            ``_do_handle_stream``), any peer a lookup queries (peer_routing.py, "regardless of query outcome",
            connected light clients included when the table is small) and any peer whose protocols identify has not
            told yet: every light client that looks something up would join the servers' tables and be handed out
            to others (found by bench/swarm.py). Here only a peer that identify says serves Kademlia joins."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                table = self.routing_table
                add = table.add_peer
                store = self.host.get_peerstore()

                async def add_server(peer_obj: Any, **kw: Any) -> bool:
                    pid = getattr(peer_obj, "peer_id", peer_obj)
                    try:
                        protocols = store.get_protocols(pid) or []
                    except Exception:  # noqa: BLE001 - a peer the peerstore does not know (yet)
                        return False
                    if str(KAD_PROTOCOL) not in protocols:
                        return False
                    added: bool = await add(peer_obj, **kw)
                    return added

                table.add_peer = add_server  # type: ignore[method-assign]  # our own table: py-libp2p has no hook

        mode = DHTMode.SERVER if self.mode is Mode.SERVER else DHTMode.CLIENT
        # max_peers_per_subnet=0: many Tally nodes may share a public /24 (shared/notes/py-libp2p-network.md §5)
        self.dht = ServersOnlyDHT(self.host.libp2p, mode, enable_random_walk=False, enable_providers=False,
                                  enable_values=False, max_peers_per_subnet=0)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(background_trio_service(self.dht))
            self.ready.set()
            task_status.started()
            await trio.sleep_forever()

    async def add_peer(self, peer_id: str) -> bool:
        """Put a connected peer into the routing table (once identify has its protocols); returns whether it
        was added (a client-mode peer is not)."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.id import ID

        await self.ready.wait()
        added: bool = await self.dht.add_peer(ID.from_base58(peer_id))
        return added

    def follow_connections(self) -> None:
        """Put every peer this host connects to (either way) into the routing table once identify has its
        protocols (a peer in client mode never joins it). At most :data:`MAX_ADOPTING` at once."""
        self._adopting: set[str] = set()

        def connected(peer: str, _conn: Any) -> None:
            if peer not in self._adopting and len(self._adopting) < MAX_ADOPTING:
                self._adopting.add(peer)
                self.host.spawn(self._adopt, peer)

        self.host.on_connected.append(connected)

    async def _adopt(self, peer: str) -> None:
        try:
            for _ in range(ADOPT_TRIES):
                if await self.add_peer(peer):
                    return
                await trio.sleep(ADOPT_GAP)
        except Exception as e:  # noqa: BLE001 - a peer gone mid-check; py-libp2p raises several types
            log.debug("routing table: %s not added: %s: %s", peer[:16], type(e).__name__, e)
        finally:
            self._adopting.discard(peer)

    async def join(self, wait: float = 10.0) -> bool:
        """Kademlia's join (Maymounkov & Mazières 2002, section 2.3): once the routing table holds a peer (at most
        ``wait`` seconds), look up this node's own id, which fills the buckets near it and tells the peers on
        the way about it. Returns whether a peer was there to start from."""
        await self.ready.wait()
        with trio.move_on_after(wait):
            while self.routing_table_size() == 0:
                await trio.sleep(0.1)
        if self.routing_table_size() == 0:
            return False
        try:
            await self.dht.refresh_routing_table()
        except Exception as e:  # noqa: BLE001 - a lookup's failures; py-libp2p raises several types
            log.debug("join lookup failed: %s: %s", type(e).__name__, e)
        return True

    async def find_peer_addrs(self, peer: str) -> list[str]:
        """The addresses of ``peer`` (``.../p2p/<peer>``) that a Kademlia lookup finds, [] when none: how a node
        reaches a server it never heard of (a worker whose receipt it checks) without any presence gossip."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.id import ID

        await self.ready.wait()
        try:
            pid = ID.from_base58(peer)
            with trio.move_on_after(REQUEST_TIMEOUT * 2):
                info = await self.dht.find_peer(pid)
                if info is not None:  # with or without the peer's /p2p/ suffix; relay circuits kept
                    plain = [str(a).removesuffix(f"/p2p/{peer}") for a in info.addrs]
                    return [f"{a}/p2p/{peer}" for a in dict.fromkeys(plain)
                            if "/p2p/" not in a or a.endswith("/p2p-circuit")][:8]
        except Exception as e:  # noqa: BLE001 - a bad peer id or a failed query; py-libp2p raises several types
            log.debug("find_peer %s: %s: %s", peer[:16], type(e).__name__, e)
        return []

    def routing_table_size(self) -> int:
        """Peers in the Kademlia routing table (bounded by its k-buckets: 20 per bucket, 256 buckets)."""
        return 0 if self.dht is None else int(self.dht.get_routing_table_size())

    async def closest(self, key: bytes, count: int | None = None) -> list[str]:
        """The ``count`` peers closest to ``key`` in the network, nearest first (iterative lookup, XOR metric),
        reused for :data:`CLOSEST_TTL` seconds: records are republished every minute to the same few peers, so a
        client that looks a route up again asks them directly (a failed peer is dropped from the list)."""
        await self.ready.wait()
        count = self.replication if count is None else count
        hit = self._closest.get(key)
        if hit is not None and trio.current_time() - hit[0] < CLOSEST_TTL and len(hit[1]) >= min(count, 2):
            return hit[1][:count]
        peers = await self.dht.peer_routing.find_closest_peers_network(key, count)
        out = [p.to_base58() for p in peers][:count]
        self._closest.pop(key, None)
        while len(self._closest) >= MAX_CLOSEST_KEYS:
            self._closest.popitem(last=False)
        self._closest[key] = (trio.current_time(), out)
        return out

    def _failed(self, key: bytes, peer: str) -> None:
        hit = self._closest.get(key)
        if hit is not None and peer in hit[1]:
            hit[1].remove(peer)

    # ------------------------------------------------------------------ serving (server mode)

    async def _serve(self, msg: dict[str, Any], remote: str) -> dict[str, Any]:
        now = self.clock()
        op = msg.get("op")
        if op == "store":
            try:
                rec = decode_record(msg.get("record"), now)  # type: ignore[arg-type]  # checked inside
            except RecordError as e:
                self.counters.bad_records += 1
                self.host.penalize(remote, BAD_RECORD)
                raise RemoteError("bad_record", str(e)) from None
            if account_to_str(rec.account) != remote:
                raise RemoteError("not_yours", "a node stores only its own span record")
            self.counters.served_store += 1
            return {"held": self.store.put(rec, now)}
        if op == "find":
            key, limit = msg.get("key"), msg.get("limit", ANSWER_LIMIT)
            if not isinstance(key, bytes) or len(key) != 32 or type(limit) is not int or limit < 1:
                raise RemoteError("bad_request", "find needs a 32-byte key and a limit >= 1")
            self.counters.served_find += 1
            return {"records": [r.encode() for r in self.store.get(key, now, min(limit, ANSWER_LIMIT))]}
        raise RemoteError("bad_request", f"unknown op {op!r}")

    # ------------------------------------------------------------------ publishing and finding

    async def publish(self, rec: SpanRecord | Callable[[], SpanRecord], key: bytes | None = None) -> int:
        """Store a record of this node's own on the ``replication`` peers closest to its key, and here in
        server mode; returns how many peers hold it now (this node included). ``rec`` may be a function that
        signs it, with its ``key`` (:func:`span_key`): it is called once, when the closest peers are known, so a
        lookup that takes seconds does not eat into the record's life. Failures to store are counted, never
        raised.

        Raises:
            ValueError: a function without its key, or one whose record has another key.
            RecordError: what the function raises (a record that fails its own checks).
        """
        if callable(rec):
            if key is None:
                raise ValueError("a record factory needs its key")
        else:
            key = span_key(rec.model_id, rec.start)
        peers = await self.closest(key)
        final = rec() if callable(rec) else rec
        if span_key(final.model_id, final.start) != key:
            raise ValueError("a record factory must keep its model and first block")
        held = int(self.mode is Mode.SERVER and self.store.put(final, self.clock()))
        results: list[bool] = []

        async def one(peer: str) -> None:
            try:
                self.counters.sent += 1
                reply = await self.host.request(peer, DISCOVERY_PROTOCOL, {"op": "store", "record": final.encode()},
                                                REQUEST_TIMEOUT)
                results.append(reply.get("held") is True)
            except REQUEST_ERRORS as e:
                self._failed(key, peer)
                log.debug("store on %s failed: %s: %s", peer[:16], type(e).__name__, e)

        async with trio.open_nursery() as n:
            for peer in peers:
                n.start_soon(one, peer)
        return held + sum(results)

    async def find(self, model_id: bytes, block: int, limit: int = ANSWER_LIMIT) -> list[SpanRecord]:
        """Servers of ``model_id`` whose span starts at ``block``: asks the peers closest to the key, nearest
        first, one at a time, until ``limit`` records are in hand or :data:`ASK_AT_ONCE` replicas answered with
        some (each replica holds the same records: asking all of them would only repeat them; an empty answer may
        come from a replica the publisher did not see), plus this node's own store; checks every record and keeps
        each server's newest; sorted by account.

        Raises:
            ValueError: a model id that is not 32 bytes or a negative block.
        """
        key = span_key(model_id, block)
        now = self.clock()
        found: dict[bytes, SpanRecord] = {r.account: r for r in self.store.get(key, now, limit)}
        answered = 0

        async def one(peer: str) -> None:
            nonlocal answered
            try:
                self.counters.sent += 1
                reply = await self.host.request(peer, DISCOVERY_PROTOCOL, {"op": "find", "key": key, "limit": limit},
                                                REQUEST_TIMEOUT)
            except REQUEST_ERRORS as e:
                self._failed(key, peer)
                log.debug("find on %s failed: %s: %s", peer[:16], type(e).__name__, e)
                return
            raw = reply.get("records")
            if not isinstance(raw, list) or len(raw) > ANSWER_LIMIT:
                self.host.penalize(peer, BAD_RECORD)
                return
            for data in raw:
                try:
                    rec = decode_record(data, now)
                except RecordError:
                    rec = None
                if rec is None or span_key(rec.model_id, rec.start) != key:
                    self.counters.bad_records += 1
                    self.host.penalize(peer, BAD_RECORD)
                    return
                prev = found.get(rec.account)
                if prev is None or rec.seq > prev.seq:
                    found[rec.account] = rec
            answered += 1

        for peer in await self.closest(key):  # nearest first, one at a time
            await one(peer)
            if len(found) >= limit or (answered >= ASK_AT_ONCE and found):
                break  # a full answer, or two replicas' (an empty answer may be one the publisher did not see)
        recs = sorted(found.values(), key=lambda r: r.account)
        if len(recs) > limit:  # a uniform sample, as a store answers
            recs = sorted(self.rng.sample(recs, limit), key=lambda r: r.account)
        return recs

    async def find_route_records(self, model_id: bytes, start: int, end: int,
                                 limit: int = ROUTE_LIMIT) -> list[SpanRecord]:
        """Every record a route over ``[start, end)`` could use: a breadth-first walk of the positions reachable
        from ``start`` (each looked up once, in parallel per wave). Costs one lookup per reachable position, never
        one for a model or a span the route cannot use."""
        seen: set[int] = set()
        wave, out = [start], {}
        results: dict[int, list[SpanRecord]] = {}

        async def one(b: int) -> None:
            results[b] = await self.find(model_id, b, limit)

        while wave:
            seen.update(wave)
            results.clear()
            async with trio.open_nursery() as n:
                for b in wave:
                    n.start_soon(one, b)
            nxt: set[int] = set()
            for recs in results.values():
                for r in recs:
                    if r.end <= end:
                        out[(r.account, r.start)] = r
                        if r.end < end and r.end not in seen:
                            nxt.add(r.end)
            wave = sorted(nxt)
        return [out[k] for k in sorted(out)]


def with_lookup(hint: Callable[[str], Awaitable[bool | None]], find: Callable[[str], Awaitable[list[str]]],
                learn: Callable[[str, list[str]], None],
                dial: Callable[[str, list[str]], Awaitable[bool]]) -> Callable[[str], Awaitable[bool | None]]:
    """A host's ``dial_hint`` that, where ``hint`` knows no address of a peer (None), looks the peer up in the
    DHT (``find``), learns what it found and dials it. True: connected; False: every address failed; None:
    nothing known here or in the DHT."""

    async def hinted(peer: str) -> bool | None:
        known = await hint(peer)
        if known is not None:
            return known
        addrs = await find(peer)
        if not addrs:
            return None
        learn(peer, addrs)
        return await dial(peer, addrs)

    return hinted


def record_peers(records: Sequence[SpanRecord]) -> list[str]:
    """The peer ids of ``records``' servers, in order."""
    return [account_to_str(r.account) for r in records]


DISCOVERY_MODES = ("gossip", "dht")


def check_discovery(name: str) -> str:
    """``name`` if it is one of :data:`DISCOVERY_MODES` (``node start --discovery``).

    Raises:
        ValueError: another name.
    """
    if name not in DISCOVERY_MODES:
        raise ValueError(f"discovery must be one of {', '.join(DISCOVERY_MODES)} (got {name!r})")
    return name
