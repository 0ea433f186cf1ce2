"""Fetching a snapshot's chunks for state sync (:mod:`node.ledger.statesync`): the limits a syncing node holds
its peers to (:class:`SyncLimits`), each source's time budget (:class:`Source`), and the download itself
(:class:`ChunkFetch`): every serving source at once, chunks spooled to disk, BitTorrent's endgame at the end.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import trio

from ..p2p.framing import RemoteError
from . import snapshot as snap
from .core.block import Header
from .core.valset import ValidatorSet
from .seams import MsgHandler
from .snapstore import ChunkSpool

log = logging.getLogger(__name__)

SNAPSHOT_PROTOCOL = "/tally/snapshot/1.0.0"
BAD_OFFER = 5.0  # penalty points: an offer that is malformed, uncertified, or does not match its header
BAD_CHUNK = 5.0  # penalty points: a chunk that does not match its manifest
LYING = 10.0  # penalty points: a manifest whose chunks do not give its certified header's state root
SLOW = 2.0  # penalty points: a timeout, a reset, an error reply, a source past its time budget
BUSY_PAUSE_S = 1.0  # seconds a source that answered "busy" waits before it is asked again
HEDGE = 2  # sources asked for one chunk at once at most, once no chunk is left unasked (the endgame)


@dataclass(frozen=True)
class SyncLimits:
    """What :func:`node.ledger.statesync.state_sync` accepts of its peers and gives each of them. Stated here,
    never taken from a peer's claim; an operator of a node with a larger state raises ``max_bytes`` and
    ``max_chunks``.

    Attributes:
        max_chunks: chunks in one manifest (refused above, before any fetch). 16,384 chunks of the default
            1 MiB are 16 GiB, past ``max_bytes``; a manifest of 65,535 chunks is refused up front.
        max_bytes: bytes of chunks fetched for one snapshot (1 GiB; the fetch stops above it). Restoring holds
            the entries and the tree in memory, about twice this at most.
        max_chunk_bytes: bytes of one chunk reply (a chunk decodes only up to 4 MiB:
            :func:`node.ledger.snapshot.check_chunk`).
        max_offer_bytes: bytes of one offer reply (a manifest of ``max_chunks`` ids is ~560 KiB, plus one
            header and its commit: ~110 B per validator).
        max_peers: peers asked for an offer, all at once (so offers in flight hold ``max_peers x
            max_offer_bytes`` = 16 MiB at most).
        max_in_flight: chunk requests in flight at once, over all sources (so replies being read hold
            ``max_in_flight x max_chunk_bytes`` = 16 MiB at most).
        offer_timeout_s: seconds for one offer request (an offer is 1 MiB at most): a peer that never answers
            delays the start of a sync by this much.
        offer_budget_s: seconds for one peer's offer, with its headers on a chain whose set changes.
        grace_s: seconds a chunk source may take before it has delivered anything.
        min_rate: bytes per second: each byte a source delivers adds ``1 / min_rate`` seconds to its allowance
            (64 KiB/s: a 1 MiB chunk dripped over 29 s, ~36 KiB/s, runs a source out of time).
        source_budget_s: seconds of requests one source is given in all, however fast it is.
    """

    max_chunks: int = 1 << 14
    max_bytes: int = 1 << 30
    max_chunk_bytes: int = 4 * snap.CHUNK_BYTES + 64
    max_offer_bytes: int = 1 << 20
    max_peers: int = 16
    max_in_flight: int = 4
    offer_timeout_s: float = 10.0
    offer_budget_s: float = 120.0
    grace_s: float = 10.0
    min_rate: float = 64 * 1024
    source_budget_s: float = 3600.0

    @classmethod
    def capped(cls, max_bytes: int | None) -> SyncLimits:
        """The defaults with ``max_bytes`` (``node start --state-sync-max``; None: the default), the chunk count
        and the offer's size raised to match, so that a larger snapshot is not refused by count first."""
        lim = cls()
        if max_bytes is None:
            return lim
        chunks = max(lim.max_chunks, -(-max_bytes // snap.CHUNK_BYTES))  # chunks of ~1 MiB
        offer = max(lim.max_offer_bytes, chunks * 40 + (64 << 10))  # ~34 B per chunk id, plus header and commit
        return replace(lim, max_bytes=max_bytes, max_chunks=chunks, max_offer_bytes=offer)


class SourceState(enum.Enum):
    """A chunk source's standing during one state sync."""

    SERVING = "serving"
    DROPPED = "dropped"  # failed a request, sent a bad chunk, ran out of time, or lied: never asked again


@dataclass
class Source:
    """A peer that chunks are fetched from: ``spent`` seconds of its requests so far, ``received`` bytes of
    chunks it delivered."""

    peer: str
    state: SourceState = SourceState.SERVING
    spent: float = 0.0
    received: int = 0

    def allowance(self, limits: SyncLimits) -> float:
        """Seconds it may still take: ``min(source_budget_s, grace_s + received / min_rate) - spent``."""
        return min(limits.source_budget_s, limits.grace_s + self.received / limits.min_rate) - self.spent


@dataclass
class Offer:
    """A checked offer: the manifest, the certified header ``h + 1`` and its commit, the validator set that
    signed it, and the peers that offered this manifest."""

    manifest: snap.Manifest
    header: Header
    commit: Any
    validators: tuple[bytes, ...] | ValidatorSet
    sources: list[str] = field(default_factory=list)


class SyncHost(Protocol):
    """What state sync needs of the host (:class:`node.p2p.host.P2PHost`)."""

    def set_handler(self, protocol_id: str, handler: MsgHandler) -> None: ...

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int = ...) -> dict[str, Any]: ...

    def penalize(self, peer_id: str, weight: float, ban_s: float | None = None) -> bool: ...


def drop(host: SyncHost, src: Source, weight: float, why: str) -> None:
    """Stop asking ``src`` for anything in this sync, and penalise its peer ``weight`` points."""
    if src.state is SourceState.SERVING:
        log.warning("snapshot source %s dropped: %s", src.peer[:16], why)
    src.state = SourceState.DROPPED
    host.penalize(src.peer, weight)


class ChunkFetch:
    """One snapshot's download: every serving source runs a worker that takes the next chunk not yet asked for;
    when none is left, an idle worker asks for one already in flight elsewhere too (at most
    :data:`HEDGE` sources per chunk: BitTorrent's endgame), and the first copy to arrive cancels the others. So
    a slow source delays nothing that a faster one can fetch; a chunk whose source fails goes back to the queue."""

    def __init__(self, host: SyncHost, o: Offer, sources: dict[str, Source], limits: SyncLimits,
                 timeout: float, spool: ChunkSpool):
        self.host, self.o, self.sources, self.limits = host, o, sources, limits
        self.timeout, self.spool = timeout, spool
        self.pending = list(range(len(o.manifest.chunks)))[::-1]  # pop() gives the lowest index
        self.flying: dict[int, dict[str, trio.CancelScope]] = {}  # chunk index -> peer -> its request's scope
        self.over = False  # the bytes passed limits.max_bytes
        self.slots = trio.CapacityLimiter(limits.max_in_flight)  # chunk requests in flight, all sources together
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _pick(self, peer: str) -> int | None:
        if self.pending:
            return self.pending.pop()
        for i, holders in sorted(self.flying.items()):
            if peer not in holders and len(holders) < HEDGE and i not in self.spool:
                return i
        return None

    async def run(self) -> bool:
        """True when every chunk is in the spool."""
        n = len(self.o.manifest.chunks)
        async with trio.open_nursery() as nursery:
            for p in dict.fromkeys(self.o.sources):
                if self.sources[p].state is SourceState.SERVING:
                    nursery.start_soon(self._worker, self.sources[p], nursery.cancel_scope)
        return len(self.spool) == n and not self.over

    async def _worker(self, src: Source, everyone: trio.CancelScope) -> None:
        n = len(self.o.manifest.chunks)
        while src.state is SourceState.SERVING and len(self.spool) < n:
            i = self._pick(src.peer)
            if i is None:
                if not self.flying and not self.pending:
                    return
                await self._changed.wait()
                continue
            with trio.CancelScope() as scope:
                self.flying.setdefault(i, {})[src.peer] = scope
                try:
                    async with self.slots:  # the wait for a slot is not counted against the source
                        got = await chunk_from(self.host, src, self.o.manifest, i, self.limits, self.timeout)
                finally:
                    holders = self.flying.get(i, {})
                    holders.pop(src.peer, None)
                    if not holders:
                        self.flying.pop(i, None)
            if scope.cancelled_caught or i in self.spool:  # another source delivered it first
                self._notify()
                continue
            if isinstance(got, bytes):
                if self.spool.nbytes + len(got) > self.limits.max_bytes:
                    log.warning("snapshot of height %d passes %d bytes (SyncLimits.max_bytes): not fetched further",
                                self.o.manifest.height, self.limits.max_bytes)
                    self.over = True
                    everyone.cancel()
                    return
                await trio.to_thread.run_sync(self.spool.put, i, got)
                for other in self.flying.get(i, {}).values():
                    other.cancel()
            elif i not in self.flying:  # busy, or this source failed: someone else takes it
                self.pending.append(i)
            self._notify()
            if got is True:  # busy: ask again after a pause, which counts against it (a source that only ever
                src.spent += BUSY_PAUSE_S  # answers "busy" runs out of time like one that never answers)
                await trio.sleep(BUSY_PAUSE_S)


async def fetch(host: SyncHost, o: Offer, sources: dict[str, Source], limits: SyncLimits, timeout: float,
                 spool: ChunkSpool) -> bool:
    """Fetch every chunk of ``o`` into ``spool`` (:class:`ChunkFetch`); False when one could not be had from any
    source or the bytes passed ``limits.max_bytes``."""
    for p in o.sources:
        sources.setdefault(p, Source(p))
    if not await ChunkFetch(host, o, sources, limits, timeout, spool).run():
        log.info("snapshot of height %d: %d of %d chunks fetched; given up", o.manifest.height, len(spool),
                 len(o.manifest.chunks))
        return False
    return True


async def chunk_from(host: SyncHost, src: Source, m: snap.Manifest, i: int, limits: SyncLimits,
                      timeout: float) -> bytes | bool:
    """Chunk ``i`` from ``src``; else True when it answered ``busy``, False when it failed (then dropped)."""
    allowance = src.allowance(limits)
    if allowance <= 0:
        drop(host, src, SLOW, "out of time")
        return False
    t0 = trio.current_time()
    try:
        reply = await host.request(src.peer, SNAPSHOT_PROTOCOL, {"op": "chunk", "snapshot": m.id, "index": i},
                                   timeout=min(timeout, allowance), max_message=limits.max_chunk_bytes)
        data = reply.get("data")
        if not isinstance(data, bytes):
            raise snap.SnapshotError(f"chunk {i}: a reply without bytes")
        snap.check_chunk(m, i, data)
    except RemoteError as e:
        src.spent += trio.current_time() - t0
        if e.code == "busy":
            return True
        drop(host, src, SLOW, f"chunk {i}: {e}")
    except snap.SnapshotError as e:
        src.spent += trio.current_time() - t0
        drop(host, src, BAD_CHUNK, str(e))
    except Exception as e:  # noqa: BLE001 - timed out (allowance or request), reset, broken framing: any
        src.spent += trio.current_time() - t0
        drop(host, src, SLOW, f"chunk {i}: {type(e).__name__}: {e}")
    else:
        src.spent += trio.current_time() - t0
        src.received += len(data)
        return data
    return False


__all__ = ["BAD_CHUNK", "BAD_OFFER", "LYING", "SLOW", "SNAPSHOT_PROTOCOL", "ChunkFetch", "Offer", "Source",
           "SourceState", "SyncHost", "SyncLimits", "chunk_from", "drop", "fetch"]
