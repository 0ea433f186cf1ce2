"""Per-peer connection and stream limits for a node on the open internet.

py-libp2p 0.8.1's resource manager caps streams node-wide only (one peer can take every slot and starve the
rest), ignores per-protocol peer limits, and leaks a connection slot per refused connection
(`shared/notes/py-libp2p-network.md` §6). The host therefore runs without it (``set_resource_manager(None)``)
and applies these limits instead:

* **Streams**, every inbound stream of every protocol (Tally's and libp2p's own identify, ping, pubsub, relay):
  at most ``streams_per_peer`` open at once per peer, and new ones at most ``stream_rate`` per second per peer
  (a token bucket of ``stream_burst``). A stream over a limit is reset before protocol negotiation.
* **Connections**: at most ``conns_per_peer`` open per peer (the newest extra one is closed), at most
  ``conn_rate`` new connections per peer per minute, and ``max_conns`` in all. Connections this node dialled
  and connections of reserved peers (validators, bootstrap peers: :attr:`PeerLimiter.reserved`) are not held
  to ``max_conns``, so a flood of fresh identities cannot stop a validator from reaching the others.
  Per-address limits, which identities cannot dodge, apply before the handshake (:mod:`node.p2p.admission`).

Per-peer state is bounded: stream counts and buckets exist only while a peer has streams open, connection
times are kept for at most :attr:`Limits.max_tracked` peers (least recently connected forgotten first).

Each refusal costs the peer :data:`LIMIT_PENALTY` score points (:mod:`node.p2p.scoring`); a peer that keeps
pushing is disconnected and banned, so its connections are then closed as soon as they open. Honest nodes open a
handful of streams per request and one or two connections per peer, far below these numbers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

log = logging.getLogger(__name__)

LIMIT_PENALTY = 1.0  # points per refused stream or connection (20 refusals in quick succession: a ban)
HANDLER_ERROR_PENALTY = 5.0  # per stream whose handler raised on what the peer sent (4 in quick succession: a ban)


@dataclass(frozen=True)
class Limits:
    """Limits per remote peer (counts, per second / per minute) and in total.

    Raises:
        ValueError: a limit below 1.
    """

    streams_per_peer: int = 128
    stream_rate: float = 200.0  # new inbound streams per second per peer, sustained
    stream_burst: int = 400
    conns_per_peer: int = 4
    conn_rate: int = 60  # new connections per peer per minute
    max_conns: int = 512
    max_tracked: int = 4096  # peers whose recent connection times are kept (LRU)
    hello_timeout: float = 30.0  # seconds a connection may stay open without its peer completing the hello

    def __post_init__(self) -> None:
        if min(self.streams_per_peer, self.stream_rate, self.stream_burst, self.conns_per_peer, self.conn_rate,
               self.max_conns, self.max_tracked, self.hello_timeout) < 1:
            raise ValueError("every limit must be >= 1")


class Penalizer(Protocol):
    """What the limiter needs of the host: score a peer, tell whether it is banned, disconnect one connection."""

    def penalize(self, peer_id: str, weight: float) -> bool: ...

    def banned(self, peer_id: str) -> bool: ...


@dataclass
class _Bucket:
    tokens: float
    at: float


class PeerLimiter:
    """Counts streams and connections per peer and decides what to refuse (pure apart from the clock).

    Args:
        limits: the :class:`Limits`.
        clock: monotonic seconds.
    """

    def __init__(self, limits: Limits | None = None, clock: Callable[[], float] = time.monotonic):
        self.limits = limits or Limits()
        self.clock = clock
        self.streams: dict[str, int] = defaultdict(int)  # only peers with streams open
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()  # LRU, at most limits.max_tracked
        self._conn_times: OrderedDict[str, deque[float]] = OrderedDict()  # LRU, at most limits.max_tracked
        self.conns: dict[str, int] = defaultdict(int)
        self.reserved: set[str] = set()  # peers not held to max_conns (validators, bootstrap peers)
        # peers that did useful work lately are not held to max_conns either while their vouch lasts
        # (P2PHost wires this to Admission.peer_reserved)
        self.vouched: Callable[[str], float] = lambda _peer: 0.0
        self.refused_streams = 0
        self.refused_conns = 0

    def stream_opened(self, peer: str) -> str | None:
        """Account a new inbound stream of ``peer``; returns the reason to refuse it, or None (then call
        :meth:`stream_closed` when it ends)."""
        lim, now = self.limits, self.clock()
        open_now = self.streams.get(peer, 0)  # .get: a refused peer leaves no entry behind
        if open_now >= lim.streams_per_peer:
            self.refused_streams += 1
            return f"{open_now} streams open (limit {lim.streams_per_peer})"
        b = self._buckets.pop(peer, None)
        if b is None:
            b = _Bucket(float(lim.stream_burst), now)
        self._buckets[peer] = b  # most recently used last
        while len(self._buckets) > lim.max_tracked:
            self._buckets.popitem(last=False)  # a forgotten peer starts again with a full bucket: bounded harm
        b.tokens = min(float(lim.stream_burst), b.tokens + (now - b.at) * lim.stream_rate)
        b.at = now
        if b.tokens < 1.0:
            self.refused_streams += 1
            return f"more than {lim.stream_rate:g} new streams/s"
        b.tokens -= 1.0
        self.streams[peer] += 1
        return None

    def stream_closed(self, peer: str) -> None:
        """The stream accounted by :meth:`stream_opened` has ended."""
        n = self.streams.get(peer, 0) - 1
        if n > 0:
            self.streams[peer] = n
        else:
            self.streams.pop(peer, None)
            b = self._buckets.get(peer)
            if b is not None and b.tokens >= self.limits.stream_burst - 1:
                self._buckets.pop(peer, None)  # bounded memory: idle, full buckets are forgotten

    def conn_opened(self, peer: str, outbound: bool = False) -> str | None:
        """Account a new connection with ``peer`` (``outbound``: this node dialled it); returns the reason to
        close it, or None (then call :meth:`conn_closed` when it closes)."""
        lim, now = self.limits, self.clock()
        times = self._conn_times.pop(peer, None)
        if times is None:
            times = deque(maxlen=lim.conn_rate + 1)
        self._conn_times[peer] = times  # most recently connected last
        while len(self._conn_times) > lim.max_tracked:
            self._conn_times.popitem(last=False)
        while times and now - times[0] > 60.0:
            times.popleft()
        times.append(now)
        total = sum(self.conns.values())
        mine = self.conns.get(peer, 0)  # .get: a refused peer leaves no entry behind
        if mine >= lim.conns_per_peer:
            reason = f"{mine} connections open (limit {lim.conns_per_peer} per peer)"
        elif len(times) > lim.conn_rate:
            reason = f"{len(times)} connections in a minute (limit {lim.conn_rate})"
        elif total >= lim.max_conns and not outbound and peer not in self.reserved and not self.vouched(peer):
            reason = f"{total} connections in all (limit {lim.max_conns})"
        else:
            self.conns[peer] += 1
            return None
        self.refused_conns += 1
        return reason

    def conn_closed(self, peer: str) -> None:
        """A connection accounted by :meth:`conn_opened` has closed."""
        n = self.conns.get(peer, 0) - 1
        if n > 0:
            self.conns[peer] = n
        else:
            self.conns.pop(peer, None)


def _peer_of(obj: Any) -> str:
    try:
        return str(obj.muxed_conn.peer_id.to_base58())
    except Exception:  # noqa: BLE001 - any object libp2p hands us: no peer id is the answer
        return ""


class StreamGate:
    """Wraps py-libp2p's common inbound stream handler with :class:`PeerLimiter` stream accounting.

    Install with :meth:`install` on a started ``libp2p`` network (``host.get_network()``).
    """

    def __init__(self, limiter: PeerLimiter, host: Penalizer):
        self.limiter = limiter
        self.host = host

    def install(self, network: Any) -> None:
        """Replace ``network.common_stream_handler`` with the gated one (idempotent)."""
        inner = network.common_stream_handler
        if getattr(inner, "_tally_gated", False):
            return

        async def gated(stream: Any) -> None:
            peer = _peer_of(stream)
            if self.host.banned(peer):
                await _reset(stream)
                return
            why = self.limiter.stream_opened(peer)
            if why is not None:
                log.debug("refused a stream of %s: %s", peer, why)
                self.host.penalize(peer, LIMIT_PENALTY)
                await _reset(stream)
                return
            try:
                await inner(stream)
            except Exception as e:  # noqa: BLE001 - a handler's error is the stream's, never the node's (see below)
                # A handler that raises on what a peer sent (py-libp2p's pubsub raises protobuf's DecodeError on
                # ten bytes of garbage on /meshsub) would otherwise escape into the connection's nursery and stop
                # the swarm: the stream is reset and its sender penalised. trio's Cancelled is a BaseException and
                # passes through.
                log.info("stream handler error from %s: %s: %s", peer, type(e).__name__, str(e)[:200])
                self.host.penalize(peer, HANDLER_ERROR_PENALTY)
                await _reset(stream)
            finally:
                self.limiter.stream_closed(peer)

        gated.__dict__["_tally_gated"] = True  # read by the getattr above: the swarm is gated once
        network.common_stream_handler = gated
        self._gate_dials(network)

    def _gate_dials(self, network: Any) -> None:
        """Never dial a banned peer. py-libp2p dials on its own whenever something opens a stream to an
        unconnected peer (gossipsub's heartbeat does, to every peer it once saw): measured, two nodes of different
        genesis re-dialled each other twice a second through it, so one always appeared connected."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.network.exceptions import SwarmException

        dial = network.dial_peer

        async def gated_dial(peer_id: Any) -> Any:
            peer = str(peer_id)
            if self.host.banned(peer):
                raise SwarmException(f"peer {peer} is banned: not dialling it")
            return await dial(peer_id)

        network.dial_peer = gated_dial


async def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a connection that may already be gone: libp2p raises many types
        await conn.close()


async def _reset(stream: Any) -> None:
    with contextlib.suppress(Exception):  # resetting a stream that may already be gone: libp2p raises many types
        await stream.reset()


def _outbound(conn: Any) -> bool:
    d = getattr(conn, "direction", None)
    return str(getattr(d, "name", d)).upper() == "OUTBOUND"


ConnHook = Callable[[str, Any], None]
Spawn = Callable[..., None]


class ConnectionNotifee:
    """A py-libp2p ``INotifee`` that applies the connection limits and tells the node of connections.

    Args:
        limiter: the :class:`PeerLimiter`.
        host: scores and bans (:class:`Penalizer`).
        spawn: ``spawn(async_fn, *args)`` starts a background task (py-libp2p awaits notifees inside its
            connection path, so nothing slow may run inline).
        on_connected: ``fn(peer_id, conn)`` for each accepted connection (it must not block: spawn work).
        on_disconnected: ``fn(peer_id, conn)`` when an accepted connection closes.
        may_stay: ``fn()`` returning the node's ``fn(peer_id) -> bool`` (or None): whether a peer may keep a
            connection open (it completed the genesis handshake, or the relay serves it). A connection whose peer
            may not stay :attr:`Limits.hello_timeout` seconds after it opened is closed. None: nothing is closed.
    """

    def __init__(self, limiter: PeerLimiter, host: Penalizer, spawn: Spawn, on_connected: ConnHook | None = None,
                 on_disconnected: ConnHook | None = None,
                 may_stay: Callable[[], Callable[[str], bool] | None] | None = None):
        self.limiter, self.host, self.spawn = limiter, host, spawn
        self.on_connected, self.on_disconnected = on_connected, on_disconnected
        self.may_stay = may_stay
        self._accepted: set[int] = set()
        self.closed_without_hello = 0

    async def connected(self, network: Any, conn: Any) -> None:
        peer = _peer_of(conn)
        why: str | None
        if self.host.banned(peer):
            why = "banned"
            self.limiter.refused_conns += 1
        else:
            why = self.limiter.conn_opened(peer, outbound=_outbound(conn))
        if why is not None:
            log.debug("closing a connection of %s: %s", peer, why)
            if why != "banned":
                self.host.penalize(peer, LIMIT_PENALTY)
            self.spawn(_close, conn)
            return
        self._accepted.add(id(conn))
        if self.may_stay is not None and self.may_stay() is not None:
            self.spawn(self._hello_deadline, peer, conn)
        if self.on_connected is not None:
            self.on_connected(peer, conn)

    async def _hello_deadline(self, peer: str, conn: Any) -> None:
        """Close ``conn`` if its peer has not completed the hello :attr:`Limits.hello_timeout` s after it opened
        (checked again at that interval while it stays open: a relay reservation may end)."""
        while True:
            await trio.sleep(self.limiter.limits.hello_timeout)
            if id(conn) not in self._accepted:
                return
            check = self.may_stay() if self.may_stay is not None else None
            if check is None or check(peer):
                continue
            self.closed_without_hello += 1
            log.debug("closing a connection of %s: no hello within %.0f s", peer, self.limiter.limits.hello_timeout)
            await _close(conn)
            return

    async def disconnected(self, network: Any, conn: Any) -> None:
        if id(conn) not in self._accepted:
            return
        self._accepted.discard(id(conn))
        peer = _peer_of(conn)
        self.limiter.conn_closed(peer)
        if self.on_disconnected is not None:
            self.on_disconnected(peer, conn)

    async def opened_stream(self, network: Any, stream: Any) -> None:
        pass

    async def closed_stream(self, network: Any, stream: Any) -> None:
        pass

    async def listen(self, network: Any, multiaddr: Any) -> None:
        pass

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        pass
