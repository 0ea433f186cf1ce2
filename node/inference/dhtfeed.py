"""Routes from the DHT: a client looks up the span records its route can use and feeds them to its swarm table
(issue 39; records and lookups: :mod:`node.discovery`). Nothing arrives unasked: a node that plans no route for
a model hears nothing about it.

A record's addresses are signed by its server, so they are learnt as that server's (the host dials them). Its
remaining life (its Unix expiry minus now) becomes the table entry's ttl, capped by the table's own MAX_TTL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import trio

from ..discovery.record import SpanRecord
from ..keys import account_to_str
from .swarm import SwarmTable

LOOKUP_INTERVAL = 60.0  # seconds a route's lookup is reused before a plan looks again (records live 180 s;
# a missing route or a failover forces one)
LOOKUP_CONCURRENCY = 16  # lookups in flight at once for --span auto's survey of every block
FORCED_GAP = 0.5  # seconds between two forced lookups of one range (a failover, a route still missing)


class RecordFinder(Protocol):
    """What the feed needs of :class:`~node.discovery.service.Discovery`."""

    async def find(self, model_id: bytes, block: int, limit: int = ...) -> list[SpanRecord]: ...

    async def find_route_records(self, model_id: bytes, start: int, end: int,
                                 limit: int = ...) -> list[SpanRecord]: ...


class DhtFeed:
    """Feeds :class:`SwarmTable` from DHT lookups.

    Args:
        finder: the node's Discovery. swarm: the table routes are planned from. learn: ``learn(peer, addrs)``
            records a server's (signed) addresses for dialling. clock: Unix seconds (record expiries).
    """

    def __init__(self, finder: RecordFinder, swarm: SwarmTable, learn: Callable[[str, list[str]], None],
                 clock: Callable[[], float] = time.time):
        self.finder, self.swarm, self.learn, self.clock = finder, swarm, learn, clock
        self._last: dict[tuple[bytes, int, int], float] = {}  # (model, start, end) -> trio time of last lookup
        self.lookups = 0

    def feed(self, records: list[SpanRecord]) -> None:
        """Put checked records into the swarm table (as the announcements they stand for) and learn addresses."""
        now = self.clock()
        for r in records:
            peer = account_to_str(r.account)
            self.swarm.offer(peer, {
                "model_id": r.model_id, "start": r.start, "end": r.end, "addrs": list(r.addrs),
                "ttl": max(0.0, r.expires - now), "active": 0, "seq": r.seq, "throughput": r.throughput,
                "latency": r.latency, "free_cache": None if r.free_cache < 0 else r.free_cache})
            self.learn(peer, [a for a in r.addrs if a.endswith("/p2p/" + peer)])

    async def route(self, model_id: bytes, start: int, end: int, force: bool = False, /) -> int:
        """Look up the records a route over ``[start, end)`` can use, unless done less than
        :data:`LOOKUP_INTERVAL` seconds ago (:data:`FORCED_GAP` when ``force``); returns records fed."""
        key = (model_id, start, end)
        last = self._last.get(key)
        gap = FORCED_GAP if force else LOOKUP_INTERVAL
        if last is not None and trio.current_time() - last < gap:
            return 0
        if len(self._last) >= 256:  # one client plans few distinct ranges: forget them all rather than grow
            self._last.clear()
        self._last[key] = trio.current_time()
        self.lookups += 1
        recs = await self.finder.find_route_records(model_id, start, end)
        self.feed(recs)
        return len(recs)

    async def every_block(self, model_id: bytes, num_blocks: int) -> int:
        """Look up the servers starting at every block of the model (``--span auto`` measures coverage);
        returns records fed."""
        out: list[SpanRecord] = []
        limiter = trio.CapacityLimiter(LOOKUP_CONCURRENCY)

        async def one(b: int) -> None:
            async with limiter:
                out.extend(await self.finder.find(model_id, b))

        async with trio.open_nursery() as n:
            for b in range(num_blocks):
                n.start_soon(one, b)
        self.feed(out)
        return len(out)
