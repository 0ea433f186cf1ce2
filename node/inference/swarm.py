"""The swarm table: the span announcements a node hears on ``tally/<chain>/shards`` and the round trips it measured
to each peer, from which the client (:mod:`node.inference.client`) plans routes and ``--span auto`` chooses blocks.

An announcement is a gossip message signed by its sender (who must announce itself), read up to 16 KiB; a replayed or
older one (by ``seq``) is dropped, and each entry expires after its ``ttl`` (at most :data:`MAX_TTL` seconds).

Both tables are bounded whatever the number of peer ids heard (issue 39, "Bounded tables"):

* ``entries`` holds at most :data:`MAX_PEERS` announcers, ordered by when each was last heard. Every insert and
  every read pops expired entries from the head (amortized O(1)), so an entry heard more than :data:`MAX_TTL`
  seconds ago is gone by then; readers skip an entry as soon as its own ``ttl`` is over. A new peer arriving at a
  full table evicts, in order, (1) the expired entries (a full sweep, at most once per :data:`SWEEP_S` seconds),
  else (2) the live entry heard longest ago -- but at most ``max_peers // LIVE_EVICTION_SHARE`` (512) live entries
  per :data:`MAX_TTL` seconds (a token bucket): beyond that the newcomer's announcement is dropped
  (:attr:`SwarmTable.dropped`), so a flood of fresh peer ids never pushes the live swarm out in one go. Refreshes of
  a peer already in the table are always taken. There is no cap per /24 of the *announced* addresses: they are not
  authenticated (any peer may announce any address), so such a cap would only let an attacker crowd out the /24
  of an honest server.
* ``rtt`` holds at most :data:`MAX_RTT_PEERS` peers, least recently measured forgotten first.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import trio

from ..compute.shards import SpanInfo
from ..encoding import DecodeError, unpack

MAX_TTL = 300.0  # seconds; a longer announced ttl is clamped
RTT_EWMA = 0.2
MAX_PEERS = 4096  # announcers the table holds at most (SwarmTable.entries)
MAX_RTT_PEERS = 4096  # peers whose measured round trip is kept (SwarmTable.rtt; least recently measured dropped)
LIVE_EVICTION_SHARE = 8  # a full table gives up at most max_peers // 8 live entries to new peers per MAX_TTL s
SWEEP_S = 1.0  # seconds between two full sweeps for expired entries while the table is full

log = logging.getLogger("tally.client")  # the client's logger: its lines keep their name
class SpanOffer(TypedDict):
    """What a peer says of its span (a gossiped announcement or a DHT record, checked): its model and span, up to 8
    addresses, for how long it holds (``ttl``, seconds), its sessions open, ``seq``, measured ``throughput``
    (tokens/s) and ``latency`` (s), ``free_cache`` (tokens, None when not announced)."""

    model_id: bytes
    start: int
    end: int
    addrs: list[object]  # as announced: a route client dials only strings naming the peer
    ttl: float
    active: int
    seq: int
    throughput: float
    latency: float
    free_cache: int | None


class SwarmEntry(SpanOffer):
    """One peer's latest :class:`SpanOffer` as taken (:meth:`SwarmTable.offer`), its ``ttl`` capped at
    :data:`MAX_TTL`: when it was heard (``seen``, the table's clock) and how many refreshes of it were heard."""

    seen: float
    refreshes: int


def _num(v: Any, default: float = 0.0) -> float:
    """``v`` (a value of a peer's announcement: anything) as a finite float >= 0, else ``default``."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) and x >= 0 else default


def _expired(e: SwarmEntry, now: float) -> bool:
    return now - e["seen"] >= e["ttl"]


@dataclass
class SwarmTable:
    """Span announcements heard on ``tally/<chain>/shards`` (peer → model, span, measurements, seen_at; heard
    longest ago first) and the client's measured network round trip per peer (seconds, EWMA; least recently
    measured first). Bounds and eviction: the module docstring.

    Attributes:
        max_peers: ``entries`` held at most (default :data:`MAX_PEERS`).
        evicted: live entries given up to new peers since start.
        dropped: announcements of new peers dropped since start because the table was full of live entries and
            its live-eviction budget spent.
    """

    entries: OrderedDict[str, SwarmEntry] = field(default_factory=OrderedDict)
    clock: Callable[[], float] = time.monotonic  # seconds
    rtt: OrderedDict[str, float] = field(default_factory=OrderedDict)
    # set (and replaced) when a peer announces a span it did not announce before: a route may have changed
    changed: trio.Event = field(default_factory=trio.Event)
    max_peers: int = MAX_PEERS
    evicted: int = 0
    dropped: int = 0
    _tokens: float = field(default=-1.0, repr=False)  # live evictions left (-1: a full budget, set at first use)
    _tokens_at: float = field(default=0.0, repr=False)
    _swept_at: float = field(default=-math.inf, repr=False)

    async def on_announcement(self, data: bytes, from_peer: str) -> None:
        try:
            a = unpack(data, max_size=1 << 14)
            if not isinstance(a, dict) or a.get("peer") != from_peer:  # signed gossip: the sender announces itself
                return
            if not isinstance(a["model_id"], bytes):  # bytes(int) would allocate that many bytes
                raise TypeError("model_id must be bytes")
            start, end = int(a["start"]), int(a["end"])
            free = a.get("free_cache")
            self.offer(from_peer, {
                "model_id": bytes(a["model_id"]), "start": start, "end": end,
                "addrs": list(a.get("addrs", []))[:8], "ttl": _num(a["ttl"]),
                "active": int(a.get("active", 0)), "seq": int(a["seq"]),
                "throughput": _num(a.get("throughput")), "latency": _num(a.get("latency")),
                "free_cache": int(free) if isinstance(free, int) and free >= 0 else None})
        except (DecodeError, KeyError, TypeError, ValueError) as e:
            log.debug("bad announcement from %s: %s", from_peer, e)

    def offer(self, peer: str, offer: SpanOffer) -> bool:
        """Take ``peer``'s offer (checked by the caller: a gossiped announcement, or a DHT record looked up) unless
        its ``seq`` is not above the one held, stamped with the table's clock, its ttl capped at :data:`MAX_TTL`;
        set :attr:`changed` when its model or span is new. Returns whether it was taken (a full table may drop a
        new peer: :meth:`_put`)."""
        prev = self.entries.get(peer)
        if prev is not None and offer["seq"] <= prev["seq"]:
            return False  # stale or replayed
        entry: SwarmEntry = {**offer, "ttl": min(MAX_TTL, offer["ttl"]), "seen": self.clock(),
                             "refreshes": (prev["refreshes"] + 1) if prev else 0}
        if not self._put(peer, entry):
            return False
        if prev is None or (prev["model_id"], prev["start"], prev["end"]) != \
                (entry["model_id"], entry["start"], entry["end"]):
            self.changed.set()
            self.changed = trio.Event()
        return True

    def _put(self, peer: str, entry: SwarmEntry) -> bool:
        """Store ``entry`` as the most recently heard; False when ``peer`` is new, the table full of live entries
        and the live-eviction budget spent (nothing stored)."""
        now = entry["seen"]
        known = self.entries.pop(peer, None) is not None
        self._prune_head(now)
        if not known and len(self.entries) >= self.max_peers and not self._make_room(now):
            self.dropped += 1
            return False
        self.entries[peer] = entry
        return True

    def _prune_head(self, now: float) -> None:
        """Pop expired entries from the head (heard longest ago): amortized O(1) per insert."""
        while self.entries:
            head = next(iter(self.entries.values()))
            if not _expired(head, now):
                return
            self.entries.popitem(last=False)

    def _make_room(self, now: float) -> bool:
        """Free one slot of a full table for a new peer (module docstring); False when none may be freed."""
        if now - self._swept_at >= SWEEP_S:
            self._swept_at = now
            for p in [p for p, e in self.entries.items() if _expired(e, now)]:
                del self.entries[p]
            if len(self.entries) < self.max_peers:
                return True
        budget = float(max(1, self.max_peers // LIVE_EVICTION_SHARE))
        if self._tokens < 0:
            self._tokens = budget
        else:
            self._tokens = min(budget, self._tokens + (now - self._tokens_at) * budget / MAX_TTL)
        self._tokens_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        while len(self.entries) >= self.max_peers:
            self.entries.popitem(last=False)  # heard longest ago
            self.evicted += 1
        return True

    def _live(self, model_id: bytes) -> list[tuple[str, SwarmEntry]]:
        now = self.clock()
        self._prune_head(now)
        return [(p, e) for p, e in sorted(self.entries.items())
                if e["model_id"] == model_id and not _expired(e, now)]

    def live(self, model_id: bytes) -> list[tuple[str, int, int]]:
        """``[(peer, start, end), ...]`` of unexpired announcements for ``model_id``, sorted by peer."""
        return [(p, e["start"], e["end"]) for p, e in self._live(model_id)]

    def infos(self, model_id: bytes) -> list[SpanInfo]:
        """Unexpired announcements for ``model_id`` with their measurements."""
        return [SpanInfo(p, e["start"], e["end"], e["throughput"], e["latency"], e["free_cache"])
                for p, e in self._live(model_id)]

    def observe_rtt(self, peer: str, seconds: float) -> None:
        """Record a measured network round trip (step round trip minus the server's announced latency); the
        least recently measured peers beyond :data:`MAX_RTT_PEERS` are forgotten."""
        seconds = max(0.0, seconds)
        prev = self.rtt.pop(peer, None)
        self.rtt[peer] = seconds if prev is None else (1 - RTT_EWMA) * prev + RTT_EWMA * seconds
        while len(self.rtt) > MAX_RTT_PEERS:
            self.rtt.popitem(last=False)
