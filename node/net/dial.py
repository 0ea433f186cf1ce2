"""Which of a peer's addresses to dial from here, in which order, and how to race them (issue 25).

A peer tells us up to 8 addresses (:func:`node.p2p.addrs.announceable`): a NAT'd one announces a relay circuit and
its interface addresses, which are private addresses of a network we are usually not on. Dialling those waits for
a TCP timeout each (py-libp2p: ~10 s, several rounds) before the circuit is tried; the first generation of a new
user took 64 s that way. Here:

* :func:`select` drops addresses that cannot be reached from here (wildcard; link-local; loopback unless we are on
  loopback ourselves; an address family or network the kernel has no route to; private addresses of a peer that
  says it is not directly reachable — it announces a circuit — unless we share their subnet) and orders the rest:
  the path that worked last time, addresses of a subnet we share, public and other addresses, then relays. A relay
  address is a candidate from the start, raced with the direct ones, never a fallback after their timeouts.
* :func:`race` dials the candidates staggered (happy eyeballs, RFC 8305 §5: the next attempt starts when the
  previous one failed or after the Connection Attempt Delay, 250 ms) and the first success cancels the rest.

Multiaddrs are strings without ``/p2p/<peer>`` (a circuit keeps its relay's ``/p2p``), as in :mod:`node.p2p.addrs`.
"""

from __future__ import annotations

import enum
import errno
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import psutil
import trio

from ..p2p.addrs import Scope, host_ip, scope

ATTEMPT_DELAY = 0.25  # seconds between two staggered attempts: RFC 8305 §5 "Connection Attempt Delay" (250 ms)
MAX_CANDIDATES = 6  # addresses raced per dial

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
T = TypeVar("T")


class Kind(enum.Enum):
    """How a candidate address reaches the peer, in order of preference."""

    REMEMBERED = 0  # the address that worked last time (node.net.paths)
    SUBNET = 1  # an interface network we are on ourselves
    PUBLIC = 2  # globally routable, or a name
    ROUTED = 3  # a private address the kernel routes somewhere (a VPN, a routed LAN, a test bridge)
    RELAY = 4  # through a relay's circuit


@dataclass(frozen=True)
class LocalView:
    """What this node knows about its own position, for :func:`select`.

    Attributes:
        nets: its interface networks (address and prefix), loopback included.
        loopback: it listens on loopback (its peers may be on this machine: the devnet, tests).
        routable: ``routable(ip)`` — the kernel has a route to ``ip`` (:func:`kernel_routes`); default: always.
    """

    nets: tuple[Network, ...] = ()
    loopback: bool = False
    routable: Callable[[str], bool] = field(default=lambda ip: True, compare=False)

    def on_subnet(self, ip: str) -> bool:
        """Whether ``ip`` lies in one of :attr:`nets` other than a loopback network."""
        try:
            a = ipaddress.ip_address(ip.split("%")[0])
        except ValueError:
            return False
        return any(a.version == n.version and a in n and not n.network_address.is_loopback for n in self.nets)


def interface_networks() -> tuple[Network, ...]:
    """This host's interface networks (``10.0.0.5/24`` → ``10.0.0.0/24``), read from the kernel now."""
    out: list[Network] = []
    for entries in psutil.net_if_addrs().values():
        for e in entries:
            if e.family not in (socket.AF_INET, socket.AF_INET6) or not e.netmask:
                continue
            try:
                out.append(ipaddress.ip_network(f"{e.address.split('%')[0]}/{e.netmask}", strict=False))
            except ValueError:
                continue
    return tuple(dict.fromkeys(out))


def kernel_routes(ip: str) -> bool:
    """Whether the kernel has a route to ``ip``: a UDP ``connect()`` (no packet is sent) fails with
    ENETUNREACH/EHOSTUNREACH/EADDRNOTAVAIL/EAFNOSUPPORT where a TCP dial would fail with "Network is unreachable"
    or "Cannot assign requested address". Other errors count as routable (the dial will tell)."""
    try:
        a = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return True
    fam = socket.AF_INET6 if a.version == 6 else socket.AF_INET
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((str(a), 9))
    except OSError as e:
        return e.errno not in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
    return True


def local_view(bound: Iterable[str]) -> LocalView:
    """The :class:`LocalView` of a node listening on ``bound`` (multiaddrs), from the kernel; its route answers
    are cached per IP for the view's life (at most 4096 IPs)."""
    bound = list(bound)
    routes: dict[str, bool] = {}

    def routable(ip: str) -> bool:
        r = routes.get(ip)
        if r is None:
            if len(routes) >= 4096:
                routes.clear()
            r = routes[ip] = kernel_routes(ip)
        return r

    return LocalView(nets=interface_networks(), loopback=any(scope(a) is Scope.LOOPBACK for a in bound),
                     routable=routable)


def classify(addr: str, view: LocalView, relayed_peer: bool) -> Kind | None:
    """The :class:`Kind` of one remote address as seen from ``view``, or None when it cannot be reached from here.

    Args:
        addr: a multiaddr of the peer (no ``/p2p/<peer>``).
        view: this node's :class:`LocalView`.
        relayed_peer: the peer announces a circuit address, i.e. it says it is not directly reachable: its
            private addresses are then dialled only on a subnet we share.
    """
    s = scope(addr)
    if s is Scope.RELAY:
        return Kind.RELAY
    if s is Scope.DNS:
        return Kind.PUBLIC
    if s in (Scope.WILDCARD, Scope.LINK_LOCAL):
        return None
    if s is Scope.LOOPBACK:
        return Kind.SUBNET if view.loopback else None
    ip = host_ip(addr)
    if ip is None:
        return None
    if view.on_subnet(ip):
        return Kind.SUBNET
    if not view.routable(ip):
        return None
    if s is Scope.PUBLIC:
        return Kind.PUBLIC
    return None if relayed_peer else Kind.ROUTED


def select(addrs: Iterable[str], view: LocalView, remembered: str | None = None,
           limit: int = MAX_CANDIDATES) -> list[str]:
    """The addresses worth dialling, best first (see the module doc), at most ``limit``.

    Args:
        addrs: the peer's known addresses (no ``/p2p/<peer>``), in the peer's own order of preference.
        view: this node's :class:`LocalView`.
        remembered: the address that worked last time (:class:`node.net.paths.PathBook`); first if still usable.
        limit: candidates returned, >= 1.

    Returns:
        The candidates; a relay address is kept even when direct ones exist (it is raced with them).
    """
    addrs = list(dict.fromkeys(addrs))
    relayed_peer = any(scope(a) is Scope.RELAY for a in addrs)
    ranked: list[tuple[int, int, str]] = []
    for i, a in enumerate(addrs):
        k = classify(a, view, relayed_peer)
        if k is None:
            continue
        ranked.append((Kind.REMEMBERED.value if a == remembered else k.value, i, a))
    ranked.sort()
    out = [a for _, _, a in ranked]
    if len(out) > limit:  # keep one relay within the limit: it is the candidate that works behind any NAT
        relay = next((a for a in out if scope(a) is Scope.RELAY), None)
        out = out[:limit]
        if relay is not None and relay not in out:
            out = out[:limit - 1] + [relay]
    return out

Attempt = Callable[[T], Awaitable[bool]]


async def race(candidates: list[T], attempt: Attempt[T], delay: float = ATTEMPT_DELAY) -> T | None:
    """Happy eyeballs (RFC 8305 §5): start ``attempt(candidates[0])``; start the next candidate when the previous
    attempt has failed or ``delay`` seconds have passed, whichever is first; the first attempt that returns True
    wins and every other one is cancelled.

    Args:
        candidates: in order of preference.
        attempt: ``await attempt(c)`` -> True on success; it must bound its own time. An exception counts as a
            failure (it is not propagated).
        delay: the Connection Attempt Delay in seconds (> 0).

    Returns:
        The winning candidate, or None when every attempt failed.
    """
    if not candidates:
        return None
    winner: list[T] = []

    async with trio.open_nursery() as n:
        async def one(c: T, failed: trio.Event) -> None:
            try:
                ok = await attempt(c)
            except Exception:  # noqa: BLE001 - any failure of one candidate just lets the next one start
                ok = False
            if ok and not winner:
                winner.append(c)
                n.cancel_scope.cancel()
            failed.set()

        for c in candidates:
            failed = trio.Event()
            n.start_soon(one, c, failed)
            with trio.move_on_after(delay):
                await failed.wait()
    return winner[0] if winner else None
