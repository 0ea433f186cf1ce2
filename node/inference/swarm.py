"""The swarm table: the span announcements a node hears on ``tally/<chain>/shards`` and the round trips it measured
to each peer, from which the client (:mod:`node.inference.client`) plans routes and ``--span auto`` chooses blocks.

An announcement is a gossip message signed by its sender (who must announce itself), read up to 16 KiB; a replayed or
older one (by ``seq``) is dropped, and each entry expires after its ``ttl`` (at most :data:`MAX_TTL` seconds).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import trio

from ..compute.shards import SpanInfo
from ..encoding import DecodeError, unpack

MAX_TTL = 300.0  # seconds; a longer announced ttl is clamped
RTT_EWMA = 0.2

log = logging.getLogger("tally.client")  # the client's logger: its lines keep their name


class SwarmEntry(TypedDict):
    """One peer's latest announcement as heard (:meth:`SwarmTable.on_announcement`): its model and span, up to 8
    addresses, when it was heard (``seen``, the table's clock) and for how long it holds (``ttl``, seconds), its
    sessions open, ``seq``, measured ``throughput`` (tokens/s) and ``latency`` (s), ``free_cache`` (tokens, None
    when not announced) and how many refreshes of it were heard."""

    model_id: bytes
    start: int
    end: int
    addrs: list[object]  # as announced: a route client dials only strings naming the peer
    seen: float
    ttl: float
    active: int
    seq: int
    throughput: float
    latency: float
    free_cache: int | None
    refreshes: int


def _num(v: Any, default: float = 0.0) -> float:
    """``v`` (a value of a peer's announcement: anything) as a finite float >= 0, else ``default``."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) and x >= 0 else default


@dataclass
class SwarmTable:
    """Span announcements heard on ``tally/<chain>/shards`` (peer → model, span, measurements, seen_at) and the
    client's measured network round trip per peer (seconds, EWMA)."""

    entries: dict[str, SwarmEntry] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic  # seconds
    rtt: dict[str, float] = field(default_factory=dict)
    # set (and replaced) when a peer announces a span it did not announce before: a route may have changed
    changed: trio.Event = field(default_factory=trio.Event)

    async def on_announcement(self, data: bytes, from_peer: str) -> None:
        try:
            a = unpack(data, max_size=1 << 14)
            if not isinstance(a, dict) or a.get("peer") != from_peer:  # signed gossip: the sender announces itself
                return
            if not isinstance(a["model_id"], bytes):  # bytes(int) would allocate that many bytes
                raise TypeError("model_id must be bytes")
            start, end = int(a["start"]), int(a["end"])
            ttl = min(MAX_TTL, _num(a["ttl"]))
            prev = self.entries.get(from_peer)
            if prev is not None and int(a["seq"]) <= prev["seq"]:
                return  # stale or replayed announcement
            free = a.get("free_cache")
            self.entries[from_peer] = {
                "model_id": bytes(a["model_id"]), "start": start, "end": end,
                "addrs": list(a.get("addrs", []))[:8], "seen": self.clock(), "ttl": ttl,
                "active": int(a.get("active", 0)), "seq": int(a["seq"]),
                "throughput": _num(a.get("throughput")), "latency": _num(a.get("latency")),
                "free_cache": int(free) if isinstance(free, int) and free >= 0 else None,
                "refreshes": (prev["refreshes"] + 1) if prev else 0}
            if prev is None or (prev["model_id"], prev["start"], prev["end"]) != (a["model_id"], start, end):
                self.changed.set()
                self.changed = trio.Event()
        except (DecodeError, KeyError, TypeError, ValueError) as e:
            log.debug("bad announcement from %s: %s", from_peer, e)

    def _live(self, model_id: bytes) -> list[tuple[str, SwarmEntry]]:
        now = self.clock()
        return [(p, e) for p, e in sorted(self.entries.items())
                if e["model_id"] == model_id and now - e["seen"] < e["ttl"]]

    def live(self, model_id: bytes) -> list[tuple[str, int, int]]:
        """``[(peer, start, end), ...]`` of unexpired announcements for ``model_id``, sorted by peer."""
        return [(p, e["start"], e["end"]) for p, e in self._live(model_id)]

    def infos(self, model_id: bytes) -> list[SpanInfo]:
        """Unexpired announcements for ``model_id`` with their measurements."""
        return [SpanInfo(p, e["start"], e["end"], e["throughput"], e["latency"], e["free_cache"])
                for p, e in self._live(model_id)]

    def observe_rtt(self, peer: str, seconds: float) -> None:
        """Record a measured network round trip (step round trip minus the server's announced latency)."""
        seconds = max(0.0, seconds)
        prev = self.rtt.get(peer)
        self.rtt[peer] = seconds if prev is None else (1 - RTT_EWMA) * prev + RTT_EWMA * seconds
