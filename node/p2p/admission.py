"""Admission of raw inbound TCP connections, before any handshake (issue 23, "Limits before the handshake").

What py-libp2p 0.8.1 does on its own (``libp2p/network/swarm.py``):

* every accepted socket takes one of ``max_connections - min_connections`` = 300 - 50 = **250** inbound slots
  (``Swarm._inbound_limiter``, :349-353, taken at :1982) before a byte is read, whoever sent it;
* the Noise + Yamux upgrade may take ``inbound_upgrade_timeout`` = **10 s** (``network/config.py:26``, applied at
  :2134-2161): 250 idle sockets from one process, no key and no byte sent, lock everyone else out for 10 s at a
  time (finding 2);
* once upgraded, the accept handler keeps its slot in ``await self.manager.wait_finished()`` (:2059-2060), i.e.
  until the **swarm** stops, not until the connection closes. Each upgraded inbound connection in a node's life
  costs one of the 250 slots for good: a banned peer reconnecting ~250 times (or honest churn over days) leaves
  a node that no new peer can reach, while Tally's own limits (which count live connections) see nothing
  (finding 6; reproduced by ``tests/net/test_admission.py``).

:func:`install` replaces ``Swarm._handle_inbound_connection`` on one swarm with Tally's handler, which

1. asks :class:`Admission` whether the remote IP may open one more connection, counting per IP address, per
   subnet (/24 for IPv4, /56 for IPv6), pending (accepted, not yet upgraded) and open (pending + upgraded), a
   token-bucket accept rate per IP, per subnet and node-wide (unreserved addresses), and totals of which
   :attr:`AdmissionLimits.reserved` slots are kept for reserved addresses (bootstrap peers', validators', peers
   vouched for by the node: :meth:`Admission.reserve_ip`);
   a refused socket is closed at once, before it costs a handshake: for TCP listeners in the listener's accept
   loop itself, before a trio task or stream object exists (:mod:`node.p2p.listener_guard`; ``SO_LINGER`` 0);
2. upgrades with ``inbound_upgrade_timeout`` = :attr:`AdmissionLimits.upgrade_timeout` (a few seconds);
3. holds the connection's counts exactly while it is open: they are given back when its muxer shuts down.

Everything here is keyed by IP address or subnet, never by peer ID (identities cost nothing to mint), and every
table is bounded (:attr:`AdmissionLimits.max_tracked`).
"""

from __future__ import annotations

import contextlib
import enum
import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from .listener_guard import ListenerGuard, guard_listeners
from .shun import ShunList, ShunPolicy

log = logging.getLogger(__name__)


class Refusal(enum.Enum):
    """Why a raw inbound connection was closed before its handshake."""

    RATE_IP = "accept_rate_per_ip"
    RATE_SUBNET = "accept_rate_per_subnet"
    RATE_TOTAL = "accept_rate_total"
    PENDING_IP = "pending_per_ip"
    PENDING_SUBNET = "pending_per_subnet"
    PENDING_TOTAL = "pending_total"
    OPEN_IP = "open_per_ip"
    OPEN_SUBNET = "open_per_subnet"
    OPEN_TOTAL = "open_total"
    NO_ADDRESS = "no_address"
    UPGRADE_FAILED = "upgrade_failed"  # counted after the fact: timeout, bad Noise, no common muxer


_CHARGED_TO_IP = frozenset({Refusal.RATE_IP, Refusal.PENDING_IP, Refusal.OPEN_IP})
_CHARGED_TO_SUBNET = frozenset({Refusal.RATE_SUBNET, Refusal.PENDING_SUBNET, Refusal.OPEN_SUBNET})


@dataclass(frozen=True)
class AdmissionLimits:
    """Limits on inbound connections by remote address (counts; seconds; accepts per second).

    ``open`` counts a connection from its accept until it closes (pending and upgraded alike), ``pending`` until
    its upgrade ends. The ``reserved`` slots of ``open_total`` and ``pending_total`` are only for reserved IPs,
    which also skip the per-IP, per-subnet and rate limits.

    Raises:
        ValueError: a limit below 1 (``reserved`` below 0 or not below both totals), or a non-positive timeout.
    """

    open_per_ip: int = 32  # held identities cost the node gossip and pings: 64 from one address cost ~0.25 core
    open_per_subnet: int = 256
    open_total: int = 768
    pending_per_ip: int = 16  # a Noise handshake takes ~10-50 ms: honest peers rarely have more than 1-2 pending
    pending_per_subnet: int = 64
    pending_total: int = 256  # also bounds the handshakes' CPU at once
    reserved: int = 32
    # Accept rates bound the upgrades (Noise, Yamux, identify, hello, pubsub: ~20 ms of CPU each for a fresh
    # identity, measured on one core) that unreserved addresses can make the node compute: at most
    # total_accept_rate x 20 ms = 1 core node-wide, subnet_accept_rate x 20 ms = 0.5 core from one /24 (/56),
    # leaving half of total_accept_rate to every other subnet. Honest peers reconnect a few times a minute.
    accept_rate: float = 10.0  # new connections per second per IP, sustained
    accept_burst: int = 32
    subnet_accept_rate: float = 25.0  # per /24 (/56)
    subnet_accept_burst: int = 64
    total_accept_rate: float = 50.0  # node-wide, unreserved addresses only
    total_accept_burst: int = 128
    upgrade_timeout: float = 4.0  # seconds for Noise + Yamux negotiation of one inbound connection
    max_tracked: int = 4096  # IPs and subnets whose state is kept (LRU beyond)
    # A source refused shun_after times within one second (per IP or per subnet reasons only) has its SYNs dropped
    # in the kernel for shun_seconds (node.p2p.shun, node.p2p.synfilter); shun_after 0: never.
    shun_after: int = 64
    shun_seconds: float = 5.0
    shun_max: int = 128  # sources shunned at once

    def __post_init__(self) -> None:
        if min(self.open_per_ip, self.open_per_subnet, self.open_total, self.pending_per_ip,
               self.pending_per_subnet, self.pending_total, self.accept_burst, self.subnet_accept_burst,
               self.total_accept_burst, self.max_tracked) < 1:
            raise ValueError("every admission limit must be >= 1")
        if not 0 <= self.reserved < min(self.open_total, self.pending_total):
            raise ValueError("reserved must be >= 0 and below open_total and pending_total")
        if min(self.accept_rate, self.subnet_accept_rate, self.total_accept_rate, self.upgrade_timeout) <= 0:
            raise ValueError("accept rates and upgrade_timeout must be > 0")
        self.shun_policy()  # raises ValueError for a bad shun setting

    def shun_policy(self) -> ShunPolicy:
        """The :class:`~node.p2p.shun.ShunPolicy` of these limits."""
        return ShunPolicy(self.shun_after, self.shun_seconds, self.shun_max, self.max_tracked)


def _parse_ip(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``ip`` parsed (a zone suffix ``%eth0`` dropped, an IPv4-mapped IPv6 address as its IPv4 address), or None
    when it is no IP address."""
    try:
        a = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        return a.ipv4_mapped
    return a


def subnet_of(ip: str) -> str:
    """The subnet ``ip`` is counted in: ``a.b.c.0/24`` for IPv4 (an IPv4-mapped IPv6 address counts as its
    IPv4 address), ``/56`` for IPv6; an unparsable string is its own subnet."""
    a = _parse_ip(ip)
    if a is None:
        return ip
    bits = 24 if a.version == 4 else 56
    return str(ipaddress.ip_network(f"{a}/{bits}", strict=False))


def normal_ip(ip: str) -> str:
    """``ip`` in canonical form (IPv4-mapped IPv6 as IPv4); unparsable strings unchanged."""
    a = _parse_ip(ip)
    return ip if a is None else str(a)


class _Counter:
    """Counts per key; a key at zero is removed, so the table only holds keys with something open."""

    def __init__(self) -> None:
        self.n: dict[str, int] = {}

    def get(self, key: str) -> int:
        return self.n.get(key, 0)

    def add(self, key: str, d: int) -> None:
        v = self.n.get(key, 0) + d
        if v > 0:
            self.n[key] = v
        else:
            self.n.pop(key, None)


class Ticket:
    """One admitted inbound connection's share of the counts. :meth:`upgraded` once Noise + Yamux are done,
    :meth:`close` when the connection has closed (idempotent; also after a failed upgrade)."""

    __slots__ = ("adm", "ip", "open", "peer", "pending", "subnet")

    def __init__(self, adm: Admission, ip: str, subnet: str):
        self.adm, self.ip, self.subnet = adm, ip, subnet
        self.pending = self.open = True
        self.peer: str | None = None

    def upgraded(self, peer: str) -> None:
        """The handshake is done: the connection is no longer pending; ``peer`` is its authenticated ID."""
        self.peer = peer
        if self.pending:
            self.pending = False
            self.adm._unpend(self)
        until = self.adm.peer_reserved(peer)
        if until:
            self.adm.reserve_ip(self.ip, until)  # a validator's or useful peer's next connection is reserved too

    def close(self) -> None:
        """Give every count back (the connection closed, or its upgrade failed)."""
        if self.pending:
            self.pending = False
            self.adm._unpend(self)
        if self.open:
            self.open = False
            self.adm._unopen(self)


class Admission:
    """Decides which raw inbound connections to accept (pure apart from the clock).

    Args:
        limits: :class:`AdmissionLimits`.
        clock: monotonic seconds.
    """

    def __init__(self, limits: AdmissionLimits | None = None, clock: Callable[[], float] = time.monotonic):
        self.limits = limits or AdmissionLimits()
        self.clock = clock
        self.pending_ip, self.pending_sub, self.open_ip, self.open_sub = _Counter(), _Counter(), _Counter(), _Counter()
        self.pending = 0
        self.open = 0
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # ip or subnet -> (tokens, at)
        self.reserved_ips: OrderedDict[str, float] = OrderedDict()  # ip -> until (monotonic s); LRU, max_tracked
        self.reserved_peers: set[str] = set()  # set by the node (validators, bootstrap peers): bounded by config
        self.vouched: OrderedDict[str, float] = OrderedDict()  # peer -> until (monotonic s); LRU, max_tracked
        self.refused: dict[str, int] = {r.value: 0 for r in Refusal}
        self.accepted = 0
        self._keys: OrderedDict[str, tuple[str, str]] = OrderedDict()  # raw ip -> (normal ip, subnet); LRU
        self._total: tuple[float, float] = (float(self.limits.total_accept_burst), clock())  # (tokens, at)
        # sources refused too often: their SYNs dropped in the kernel for a while (node.p2p.shun)
        self.shun = ShunList(self.limits.shun_policy(), clock, reserved=self.ip_reserved,
                             reserved_ips=lambda: list(self.reserved_ips))

    def keys(self, ip: str) -> tuple[str, str]:
        """``(normal_ip(ip), subnet_of(ip))``, cached for the :attr:`AdmissionLimits.max_tracked` most recent
        addresses (parsing an address with :mod:`ipaddress` costs more than the rest of a refusal)."""
        k = self._keys.get(ip)
        if k is None:
            n = normal_ip(ip)
            k = self._keys[ip] = (n, subnet_of(n))
            while len(self._keys) > self.limits.max_tracked:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(ip)
        return k

    def reserve_ip(self, ip: str, until: float = math.inf) -> None:
        """Treat connections from ``ip`` as reserved (bootstrap peers, validators, peers that did useful work)
        until the monotonic time ``until`` (seconds; default: for good). A later reservation never shortens an
        earlier one. The table keeps the :attr:`AdmissionLimits.max_tracked` most recently reserved."""
        ip = normal_ip(ip)
        self.reserved_ips[ip] = max(until, self.reserved_ips.get(ip, until))
        self.reserved_ips.move_to_end(ip)
        while len(self.reserved_ips) > self.limits.max_tracked:
            self.reserved_ips.popitem(last=False)
        self.shun.lift_covering(ip)

    def ip_reserved(self, ip: str) -> bool:
        """Whether connections from ``ip`` are reserved now; an expired reservation is forgotten here."""
        until = self.reserved_ips.get(ip)
        if until is None:
            return False
        if until <= self.clock():
            del self.reserved_ips[ip]
            return False
        return True

    def vouch(self, peer: str, until: float) -> None:
        """Reserve slots for ``peer`` (a peer ID that recently did useful work, e.g. a receipt of it landed in a
        block) until the monotonic time ``until`` (seconds); its IP is reserved as long when it connects. The
        table keeps the :attr:`AdmissionLimits.max_tracked` most recently vouched peers."""
        self.vouched[peer] = max(until, self.vouched.get(peer, until))
        self.vouched.move_to_end(peer)
        while len(self.vouched) > self.limits.max_tracked:
            self.vouched.popitem(last=False)

    def peer_reserved(self, peer: str) -> float:
        """Until when (monotonic seconds) ``peer`` holds reserved slots: ``math.inf`` for validators and bootstrap
        peers, its vouch's end for a peer that did useful work, 0.0 for anyone else (an expired vouch is
        forgotten here)."""
        if peer in self.reserved_peers:
            return math.inf
        until = self.vouched.get(peer, 0.0)
        if until and until <= self.clock():
            del self.vouched[peer]
            return 0.0
        return until

    def _rate_ok(self, key: str, rate: float, burst: int, take: bool) -> bool:
        """Token bucket of ``key``: whether one token is there (taken when ``take``)."""
        lim, now = self.limits, self.clock()
        tokens, at = self._buckets.pop(key, (float(burst), now))
        tokens = min(float(burst), tokens + (now - at) * rate)
        ok = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if ok and take else tokens, now)  # most recently used last
        while len(self._buckets) > lim.max_tracked:
            self._buckets.popitem(last=False)  # a forgotten key starts again with a full bucket: bounded harm
        return ok

    def _total_ok(self, take: bool) -> bool:
        """The node-wide token bucket of unreserved accepts (kept apart from the LRU of per-key buckets, so no
        number of addresses can evict it): whether one token is there (taken when ``take``)."""
        lim, now = self.limits, self.clock()
        tokens, at = self._total
        tokens = min(float(lim.total_accept_burst), tokens + (now - at) * lim.total_accept_rate)
        ok = tokens >= 1.0
        self._total = (tokens - 1.0 if ok and take else tokens, now)
        return ok

    def check(self, ip: str) -> Refusal | None:
        """The reason ``ip`` may not open one more connection now, or None (no state changes but the rate)."""
        lim = self.limits
        ip, sub = self.keys(ip)
        reserved = self.ip_reserved(ip)
        hold = 0 if reserved else lim.reserved
        if not reserved:
            if self.open_ip.get(ip) >= lim.open_per_ip:
                return Refusal.OPEN_IP
            if self.open_sub.get(sub) >= lim.open_per_subnet:
                return Refusal.OPEN_SUBNET
            if self.pending_ip.get(ip) >= lim.pending_per_ip:
                return Refusal.PENDING_IP
            if self.pending_sub.get(sub) >= lim.pending_per_subnet:
                return Refusal.PENDING_SUBNET
        if self.open >= lim.open_total - hold:
            return Refusal.OPEN_TOTAL
        if self.pending >= lim.pending_total - hold:
            return Refusal.PENDING_TOTAL
        if not reserved:
            if not self._rate_ok(sub, lim.subnet_accept_rate, lim.subnet_accept_burst, take=False):
                return Refusal.RATE_SUBNET
            if not self._total_ok(take=False):
                return Refusal.RATE_TOTAL
            if not self._rate_ok(ip, lim.accept_rate, lim.accept_burst, take=True):
                return Refusal.RATE_IP
            self._rate_ok(sub, lim.subnet_accept_rate, lim.subnet_accept_burst, take=True)
            self._total_ok(take=True)
        return None

    def accept(self, ip: str | None) -> Ticket | None:
        """Admit a raw connection from ``ip`` (None: the address is unknown, refused). Returns its
        :class:`Ticket`, or None when refused (counted in :attr:`refused` by reason)."""
        if not ip:
            self.refused[Refusal.NO_ADDRESS.value] += 1
            return None
        ip, sub = self.keys(ip)
        why = self.check(ip)
        if why is not None:
            self.refused[why.value] += 1
            if why in _CHARGED_TO_IP:
                self.shun.refused(ip, subnet=False)
            elif why in _CHARGED_TO_SUBNET:
                self.shun.refused(sub, subnet=True)
            return None
        self.pending_ip.add(ip, 1)
        self.pending_sub.add(sub, 1)
        self.open_ip.add(ip, 1)
        self.open_sub.add(sub, 1)
        self.pending += 1
        self.open += 1
        self.accepted += 1
        return Ticket(self, ip, sub)

    def _unpend(self, t: Ticket) -> None:
        self.pending_ip.add(t.ip, -1)
        self.pending_sub.add(t.subnet, -1)
        self.pending -= 1

    def _unopen(self, t: Ticket) -> None:
        self.open_ip.add(t.ip, -1)
        self.open_sub.add(t.subnet, -1)
        self.open -= 1

    def stats(self) -> dict[str, Any]:
        """Counters for ``/v1/status``: open and pending inbound connections, accepted, refused by reason."""
        return {"inbound_open": self.open, "inbound_pending": self.pending, "inbound_accepted": self.accepted,
                "refused_before_handshake": {k: v for k, v in self.refused.items() if v},
                "shunned_now": len(self.shun), "shuns": self.shun.shuns}


def _remote_ip(rwc: Any) -> str | None:
    try:
        a = rwc.get_remote_address()
        return str(a[0]) if a else None
    except Exception:  # noqa: BLE001 - a socket already gone has no address: refused as such
        return None


async def _aclose(obj: Any) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(2.0), contextlib.suppress(Exception):
        await obj.close()


async def _wait_closed(muxed: Any) -> None:
    """Return once ``muxed`` (a py-libp2p muxed connection) has shut down."""
    ev = getattr(muxed, "event_shutting_down", None)
    if ev is None:
        ev = getattr(muxed, "event_closed", None)
    if ev is not None:
        await ev.wait()
        return
    while not getattr(muxed, "is_closed", True):  # another muxer: poll
        await trio.sleep(1.0)


def install(network: Any, admission: Admission, outbound_headroom: int = 256) -> None:
    """Put :class:`Admission` in front of a py-libp2p 0.8.1 ``Swarm``'s inbound path (see the module doc).

    Also sets the swarm's ``inbound_upgrade_timeout`` to :attr:`AdmissionLimits.upgrade_timeout`, and its total
    ``max_connections`` (and pruning high watermark) to ``open_total + outbound_headroom``, so py-libp2p's own
    300-connection cap, outbound included, no longer lets an inbound flood stop the node from dialling its peers.
    Wraps this swarm's ``listen`` (the instance's, not the class's: other hosts in the process keep theirs) so that
    the TCP listeners it starts refuse in their accept loop (:func:`node.p2p.listener_guard.guard_listeners`).
    Idempotent per swarm.
    """
    if getattr(network, "_tally_admission", None) is not None:
        network._tally_admission = admission
        return
    guard = ListenerGuard(lambda: network._tally_admission)
    network._tally_listener_guard = guard
    listen = network.listen

    async def listen_guarded(*maddrs: Any) -> bool:
        ok = bool(await listen(*maddrs))
        guard_listeners(network, guard)  # refusals in the accept loop from now on (node.p2p.listener_guard)
        return ok

    network.listen = listen_guarded
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.network.connection.raw_connection import RawConnection

    cfg = network.connection_config
    cfg.inbound_upgrade_timeout = admission.limits.upgrade_timeout
    total = admission.limits.open_total + outbound_headroom
    cfg.max_connections = max(cfg.max_connections, total)
    cfg.high_watermark = max(cfg.high_watermark, total)
    network._tally_admission = admission

    async def handle_inbound(read_write_closer: Any, maddr: Any) -> None:
        adm: Admission = network._tally_admission
        taken = guard.take_ticket(getattr(read_write_closer, "stream", None))
        ticket = taken if isinstance(taken, Ticket) else None
        if ticket is None:  # not through a guarded listener (another transport, or the listener's first accept)
            ticket = adm.accept(_remote_ip(read_write_closer))
        if ticket is None:
            await _aclose(read_write_closer)
            return
        raw = None
        try:
            raw = RawConnection(read_write_closer, False)
            try:
                muxed = await network.upgrade_inbound_raw_conn(raw, maddr)
            except Exception as e:  # noqa: BLE001 - timeout, Noise, muxer: py-libp2p closed what it opened
                adm.refused[Refusal.UPGRADE_FAILED.value] += 1
                log.debug("inbound upgrade from %s failed: %s: %s", ticket.ip, type(e).__name__, e)
                return
            ticket.upgraded(str(muxed.peer_id))
            await _wait_closed(muxed)
            await _aclose(muxed)
        finally:
            ticket.close()
            if raw is not None:
                await _aclose(raw)
            else:
                await _aclose(read_write_closer)

    network._handle_inbound_connection = handle_inbound
