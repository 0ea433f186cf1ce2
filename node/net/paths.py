"""Per-peer path memory and the network view: how each connected peer is reached, and its round trip (issue 25).

:class:`PathBook` remembers, per peer, the address a dial last succeeded at (:func:`node.net.dial.select` tries it
first next time) in a bounded LRU table, and :func:`describe` reads the live connections of a py-libp2p host into
:class:`PeerPath` rows: ``direct`` or ``relayed`` (through which relay), the remote address, and the round trip
measured by libp2p ping (``/ipfs/ping/1.0.0``, :meth:`PathBook.measure`). ``/v1/status``, the explorer's peers
page, ``node peers`` and ``node status`` show these rows; the route planner reads :meth:`PathBook.rtt_ms`.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

import trio

log = logging.getLogger(__name__)

MAX_PEERS = 1024  # peers remembered (LRU)
PING_TIMEOUT = 5.0  # seconds for one ping round trip
RTT_ALPHA = 0.3  # weight of a new sample in the smoothed round trip (RFC 6298 §2 uses 1/8 for SRTT; pings are rare)


class PathKind(enum.Enum):
    """How a connection reaches the peer."""

    DIRECT = "direct"
    RELAYED = "relayed"


@dataclass
class PeerPath:
    """One connected peer as :func:`describe` sees it.

    Attributes:
        peer: its peer ID.
        path: ``direct`` when some connection to it is direct, else ``relayed``.
        addr: the remote address of the connection used (a ``/p2p-circuit`` address when relayed).
        relay: the relay's peer ID when relayed, else None.
        rtt_ms: smoothed ping round trip in milliseconds, None until measured.
        conns: open connections to the peer (a relayed one may linger 60 s after a hole punch).
    """

    peer: str
    path: str
    addr: str | None
    relay: str | None
    rtt_ms: float | None
    conns: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def relay_of(addr: str) -> str | None:
    """The relay's peer ID in a circuit address ``.../p2p/<relay>/p2p-circuit[/p2p/<peer>]``, else None."""
    if "/p2p-circuit" not in addr:
        return None
    head = addr.split("/p2p-circuit", 1)[0]
    return head.rsplit("/p2p/", 1)[1] if "/p2p/" in head else None


def conn_addrs(conn: Any) -> list[str]:
    """The transport addresses of one py-libp2p connection as strings ([] when it cannot tell)."""
    try:
        return [str(a) for a in conn.get_transport_addresses()]
    except Exception:  # noqa: BLE001 - a closing connection
        return []


_LAYERS = ("muxed_conn", "secured_conn", "conn", "read_writer", "_wrapped")  # SwarmConn -> ... -> RawConnection


def relay_peer(conn: Any) -> str | None:
    """The relay a relayed py-libp2p connection runs through: the peer at the other end of the relay stream under
    its layers (swarm connection → Yamux → Noise session → raw connection → the HOP/STOP stream). py-libp2p
    0.8.1 names the wrong relay in an inbound circuit's address (its own ID, ``transport.py:1040``), so the
    address is not used. None when it cannot tell."""
    obj, seen = conn, 0
    while obj is not None and seen < 8:
        seen += 1
        stream = getattr(obj, "stream", None)
        pid = getattr(getattr(stream, "muxed_conn", None), "peer_id", None)
        if pid is not None:
            try:
                return str(pid.to_base58())
            except Exception:  # noqa: BLE001 - not a peer ID after all
                return None
        obj = next((getattr(obj, a) for a in _LAYERS if getattr(obj, a, None) is not None), None)
    return None


def is_relayed(conn: Any) -> bool:
    """Whether a py-libp2p connection runs through a relay (its transport address is a circuit)."""
    addrs = conn_addrs(conn)
    return bool(addrs) and all("/p2p-circuit" in a for a in addrs)


class PathBook:
    """Per-peer memory of the working address and of the measured round trip (bounded LRU of :data:`MAX_PEERS`).

    Path changes (a peer first seen direct or relayed, or switching) are logged once at INFO.
    """

    def __init__(self, max_peers: int = MAX_PEERS):
        self.max_peers = max_peers
        self._worked: OrderedDict[str, str] = OrderedDict()  # peer -> address a dial succeeded at
        self._rtt: OrderedDict[str, float] = OrderedDict()  # peer -> smoothed round trip, ms
        self._kind: OrderedDict[str, PathKind] = OrderedDict()  # peer -> last path logged

    @staticmethod
    def _put(table: OrderedDict[str, Any], key: str, value: Any, cap: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > cap:
            table.popitem(last=False)

    def worked(self, peer: str, addr: str) -> None:
        """A dial of ``peer`` succeeded at ``addr`` (no ``/p2p/<peer>``): try it first next time."""
        self._put(self._worked, peer, addr, self.max_peers)

    def remembered(self, peer: str) -> str | None:
        """The address a dial of ``peer`` last succeeded at, or None."""
        return self._worked.get(peer)

    def forget(self, peer: str, addr: str) -> None:
        """A dial of ``peer`` at its remembered ``addr`` failed: stop preferring it."""
        if self._worked.get(peer) == addr:
            del self._worked[peer]

    def sample(self, peer: str, rtt_ms: float) -> float:
        """Add one round-trip sample in milliseconds (>= 0); returns the smoothed value (exponential average)."""
        old = self._rtt.get(peer)
        new = rtt_ms if old is None else (1 - RTT_ALPHA) * old + RTT_ALPHA * rtt_ms
        self._put(self._rtt, peer, new, self.max_peers)
        return new

    def rtt_ms(self, peer: str) -> float | None:
        """The smoothed round trip to ``peer`` in milliseconds, None until measured."""
        return self._rtt.get(peer)

    def observe(self, peer: str, kind: PathKind, addr: str | None) -> bool:
        """Record the current path of a connected ``peer``; logs one INFO line and returns True when it changed."""
        if self._kind.get(peer) is kind:
            self._kind.move_to_end(peer)
            return False
        before = self._kind.get(peer)
        self._put(self._kind, peer, kind, self.max_peers)
        log.info("peer %s: %s%s%s", peer, kind.value, f" at {addr}" if addr else "",
                 f" (was {before.value})" if before is not None else "")
        return True

    def disconnected(self, peer: str) -> None:
        """``peer`` has no connection left: its next connection's path is logged again."""
        self._kind.pop(peer, None)

    async def measure(self, host: Any, peer_id: Any) -> float | None:
        """Ping ``peer_id`` (a py-libp2p ``ID``) once over its best connection; returns the smoothed round trip
        in ms, None when the ping failed (logged at DEBUG: a peer may not serve ping)."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.host.ping import ID as PING, perform_ping_roundtrip

        stream = None
        try:
            with trio.fail_after(PING_TIMEOUT):
                stream = await host.new_stream(peer_id, [PING])
                start = trio.current_time()
                await perform_ping_roundtrip(stream)
                rtt = (trio.current_time() - start) * 1000.0  # ms, finer than the library's whole ms
        except Exception as e:  # noqa: BLE001 - unreachable, reset, slow: no sample
            log.debug("ping %s failed: %s: %s", peer_id, type(e).__name__, e or "no reply within the deadline")
            return None
        finally:
            if stream is not None:
                with trio.move_on_after(1.0), contextlib.suppress(Exception):
                    await stream.close()
        return self.sample(peer_id.to_base58(), rtt)


def describe(host: Any, book: PathBook) -> list[PeerPath]:
    """One :class:`PeerPath` per connected peer of py-libp2p host ``host``, sorted by peer ID; records each
    peer's path in ``book`` (:meth:`PathBook.observe`)."""
    rows = []
    for pid, conns in sorted(host.get_network().get_connections_map().items(), key=lambda kv: kv[0].to_base58()):
        conns = [c for c in conns if not getattr(c, "is_closed", False)]
        if not conns:
            continue
        peer = pid.to_base58()
        direct = [c for c in conns if not is_relayed(c)]
        used = (direct or conns)[0]
        addrs = conn_addrs(used)
        addr = addrs[0] if addrs else None
        kind = PathKind.DIRECT if direct else PathKind.RELAYED
        relay = None if direct else relay_peer(used) or relay_of(addr or "")
        if relay is not None and addr is not None and relay_of(addr) != relay:  # py-libp2p's inbound circuit name
            addr = f"/p2p/{relay}/p2p-circuit/p2p/{peer}"
        book.observe(peer, kind, addr)
        rows.append(PeerPath(peer, kind.value, addr, relay, book.rtt_ms(peer), len(conns)))
    return rows
