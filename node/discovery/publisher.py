"""A span server's record, republished (I/O edge of :mod:`node.discovery`).

The server signs a fresh record every ``period`` seconds (and at once when its addresses change: a relay
reservation made or lost), valid for ``ttl`` seconds, and stores it on the peers closest to its key
(:meth:`Discovery.publish`). Petals republishes its DHT records the same way (``update_period``, expiration a few
periods later), so a server that stops is forgotten within ``ttl`` seconds without anyone announcing it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from ..keys import Identity
from .keys import span_key
from .record import MAX_TTL, RecordError, SpanRecord, sign_record

DEFAULT_PERIOD = 60.0  # seconds between republications (Petals: update_period 60 s)
TTL_PERIODS = 3  # a record outlives two missed republications
ADDR_CHECK = 0.5  # seconds between checks of the host's addresses

log = logging.getLogger("tally.discovery")


@dataclass(frozen=True)
class SpanFields:
    """What a record says besides who signs it: model (32 bytes), span, measurements (tokens/s, s, tokens)."""

    model_id: bytes
    start: int
    end: int
    throughput: float
    latency: float
    free_cache: int


class Publisher(Protocol):
    """What the loop needs of :class:`~node.discovery.service.Discovery`."""

    async def publish(self, rec: SpanRecord | Callable[[], SpanRecord], key: bytes | None = None) -> int: ...


def check_record_timing(period: float, ttl: float) -> None:
    """Raises ValueError unless ``0 < period < ttl <= MAX_TTL`` (seconds)."""
    if not 0 < period < ttl <= MAX_TTL:
        raise ValueError(f"a record's period and ttl must satisfy 0 < period < ttl <= {MAX_TTL} s "
                         f"(got {period} and {ttl})")


async def publish_loop(disc: Publisher, ident: Identity, fields: Callable[[], SpanFields],
                       addrs: Callable[[], list[str]], period: float = DEFAULT_PERIOD, ttl: float | None = None,
                       clock: Callable[[], float] = time.time) -> None:
    """Sign and publish this server's record every ``period`` seconds (Unix-clock expiry ``now + ttl``, default
    :data:`TTL_PERIODS` periods) and whenever ``addrs()`` changes; runs until cancelled. A record that fails
    its own checks (an address too long, say) is logged and skipped, never raised.

    Raises:
        ValueError: at start, a bad ``period``/``ttl`` (:func:`check_record_timing`).
    """
    ttl = period * TTL_PERIODS if ttl is None else ttl
    check_record_timing(period, ttl)
    seq = 0
    while True:
        seq = max(seq + 1, time.time_ns() // 1_000_000)  # grows across restarts too
        sent = list(addrs())
        f = fields()

        def signed(f: SpanFields = f, seq: int = seq, sent: list[str] = sent) -> SpanRecord:
            # signed once the closest peers are found (Discovery.publish): its life starts when it is stored
            return sign_record(ident, f.model_id, f.start, f.end, throughput=f.throughput, latency=f.latency,
                               free_cache=f.free_cache, addrs=tuple(sent), seq=seq, expires=math.ceil(clock() + ttl))

        try:
            held = await disc.publish(signed, span_key(f.model_id, f.start))  # signs it once
        except RecordError as e:
            log.warning("span record not published: %s", e)
        else:
            log.debug("span record [%d, %d) held by %d peer(s)", f.start, f.end, held)
        due = trio.current_time() + period
        while trio.current_time() < due and list(addrs()) == sent:
            await trio.sleep(min(ADDR_CHECK, max(due - trio.current_time(), 0)))
