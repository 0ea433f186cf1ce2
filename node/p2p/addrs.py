"""Which addresses a node listens on and which it tells others (pure; DESIGN.md, "Network across machines").

A node *binds* listen multiaddrs (``/ip4/0.0.0.0/tcp/4001`` by default, plus ``/ip6/::/tcp/4001`` where the
host has a usable IPv6 address; the devnet binds 127.0.0.1) and *announces* only addresses that another machine
could dial: ``--announce`` addresses first, then the concrete interface addresses behind a wildcard bind, then
addresses that peers confirmed by dialling back (:mod:`node.net.reachability`) and circuit-relay addresses
(:mod:`node.net.relay`). Wildcard addresses are never announced; loopback addresses only by a node bound to
loopback alone (its peers are on the same machine: the devnet and the tests).

Multiaddrs here are strings such as ``/ip4/10.0.0.2/tcp/4001`` (no ``/p2p/`` suffix unless said so).
"""

from __future__ import annotations

import enum
import ipaddress
import socket
import time
from collections.abc import Iterable

import psutil
from multiaddr import Multiaddr

DEFAULT_PORT = 4001
MAX_ANNOUNCED = 8  # addresses per announcement (span records keep at most 8 too)


class AddrError(ValueError):
    """A listen or announce multiaddr that Tally cannot use."""


class Scope(enum.Enum):
    """Where an address can be reached from."""

    LOOPBACK = "loopback"  # this machine only
    WILDCARD = "wildcard"  # 0.0.0.0 / :: — a bind address, not a destination
    LINK_LOCAL = "link-local"  # fe80::/10, 169.254/16: not routable, never announced
    PRIVATE = "private"  # RFC 1918, ULA, CGNAT: a LAN or VPN
    PUBLIC = "public"  # globally routable
    DNS = "dns"  # a name: resolved by the dialler
    RELAY = "relay"  # /p2p-circuit through another peer


def parse_addr(text: str, *, for_listen: bool) -> str:
    """Check one ``--listen`` or ``--announce`` multiaddr and return it in canonical form.

    Accepted: ``/ip4/A/tcp/P``, ``/ip6/A/tcp/P``; for announce also ``/dns4|dns6|dns/NAME/tcp/P`` and a
    relay address ``.../p2p/RELAY/p2p-circuit``. A ``/p2p/<own id>`` suffix is not allowed (it is added).

    Raises:
        AddrError: not a multiaddr, another transport, a port outside 0..65535 (announce: 1..65535), or a
            wildcard announce address.
    """
    try:
        ma = Multiaddr(text)
    except Exception as e:  # noqa: BLE001 - multiaddr's parser raises many unrelated types
        raise AddrError(f"{text!r} is not a multiaddr ({e}); expected e.g. /ip4/0.0.0.0/tcp/{DEFAULT_PORT}") from None
    names = [p.name for p in ma.protocols()]
    if not for_listen and "p2p-circuit" in names:
        return str(ma)
    if len(names) != 2 or names[1] != "tcp" or names[0] not in (("ip4", "ip6") if for_listen
                                                                else ("ip4", "ip6", "dns", "dns4", "dns6")):
        kinds = "/ip4/A/tcp/P or /ip6/A/tcp/P" if for_listen else "/ip4|ip6|dns4|dns6|dns/HOST/tcp/P"
        raise AddrError(f"{text!r}: Tally speaks TCP only: use {kinds}")
    port = int(ma.value_for_protocol("tcp"))
    if not (0 if for_listen else 1) <= port <= 65535:
        raise AddrError(f"{text!r}: port {port} out of range")
    if not for_listen and scope(str(ma)) is Scope.WILDCARD:
        raise AddrError(f"{text!r}: a wildcard address cannot be dialled; announce the address others reach")
    return str(ma)


def scope(addr: str) -> Scope:
    """Classify a multiaddr (with or without ``/p2p/``). Unknown shapes count as PRIVATE (announced only
    inside LANs, never assumed public)."""
    if "/p2p-circuit" in addr:
        return Scope.RELAY
    parts = addr.split("/")
    if len(parts) < 3:
        return Scope.PRIVATE
    kind, host = parts[1], parts[2]
    if kind in ("dns", "dns4", "dns6"):
        return Scope.LOOPBACK if host == "localhost" else Scope.DNS
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return Scope.PRIVATE
    if ip.is_unspecified:
        return Scope.WILDCARD
    if ip.is_loopback:
        return Scope.LOOPBACK
    if ip.is_link_local:
        return Scope.LINK_LOCAL
    if ip.is_global:
        return Scope.PUBLIC
    return Scope.PRIVATE


def host_ip(addr: str) -> str | None:
    """The IP of an ``/ip4|ip6/<ip>/...`` multiaddr, else None."""
    parts = addr.split("/")
    return parts[2] if len(parts) > 2 and parts[1] in ("ip4", "ip6") else None


def tcp_port(addr: str) -> int | None:
    """The TCP port of a multiaddr, else None."""
    parts = addr.split("/")
    for i, p in enumerate(parts[:-1]):
        if p == "tcp":
            try:
                return int(parts[i + 1])
            except ValueError:
                return None
    return None


def strip_peer(addr: str) -> str:
    """``/ip4/1.2.3.4/tcp/1/p2p/12D3..`` → ``/ip4/1.2.3.4/tcp/1``; a circuit address keeps its relay's ``/p2p``
    (``.../p2p/R/p2p-circuit/p2p/S`` → ``.../p2p/R/p2p-circuit``)."""
    parts = addr.split("/")
    return "/".join(parts[:-2]) if len(parts) >= 3 and parts[-2] == "p2p" else addr


def default_listen(port: int = DEFAULT_PORT, has_ipv6: bool | None = None) -> list[str]:
    """``/ip4/0.0.0.0/tcp/PORT``, plus ``/ip6/::/tcp/PORT`` when the host has a non-loopback, non-link-local
    IPv6 address (``has_ipv6`` overrides the probe)."""
    out = [f"/ip4/0.0.0.0/tcp/{port}"]
    if has_ipv6 if has_ipv6 is not None else host_has_ipv6():
        out.append(f"/ip6/::/tcp/{port}")
    return out


_IPS_TTL = 10.0  # seconds an interface listing is reused (announcements ask for it many times a second)
_ips_cache: tuple[float, list[str]] = (-1e9, [])


def interface_ips() -> list[str]:
    """Addresses of this host's interfaces (IPv4 and IPv6, link-local excluded), loopback included; re-read at
    most every :data:`_IPS_TTL` seconds."""
    global _ips_cache
    now = time.monotonic()
    if now - _ips_cache[0] < _IPS_TTL:
        return list(_ips_cache[1])
    out: list[str] = []
    for entries in psutil.net_if_addrs().values():
        for e in entries:
            if e.family in (socket.AF_INET, socket.AF_INET6):
                ip = e.address.split("%")[0]
                try:
                    if ipaddress.ip_address(ip).is_link_local:
                        continue
                except ValueError:
                    continue
                out.append(ip)
    ips = sorted(set(out), key=lambda s: (":" in s, s))
    _ips_cache = (now, ips)
    return list(ips)


def host_has_ipv6() -> bool:
    """True when an interface has an IPv6 address that is neither loopback nor link-local and ``::`` binds."""
    if not socket.has_ipv6 or not any(":" in ip and not ipaddress.ip_address(ip).is_loopback
                                      for ip in interface_ips()):
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::", 0))
    except OSError:
        return False
    return True


def expand(bound: Iterable[str], ips: Iterable[str]) -> list[str]:
    """Replace each wildcard bound address by one address per interface IP of its family (same port).

    Args:
        bound: the multiaddrs the transport actually listens on (real ports, no ``/p2p``).
        ips: this host's interface IPs (:func:`interface_ips`).
    """
    ips = list(ips)
    out: list[str] = []
    for a in bound:
        ip, port = host_ip(a), tcp_port(a)
        if ip is None or port is None or scope(a) is not Scope.WILDCARD:
            out.append(a)
            continue
        v6 = ":" in ip
        out.extend(f"/ip{'6' if v6 else '4'}/{x}/tcp/{port}" for x in ips if (":" in x) == v6)
    return list(dict.fromkeys(out))


def announceable(announce: Iterable[str], bound: Iterable[str], confirmed: Iterable[str] = (),
                 relayed: Iterable[str] = (), ips: Iterable[str] | None = None) -> list[str]:
    """The addresses this node tells others, best first, at most :data:`MAX_ANNOUNCED`.

    Order: explicit ``announce`` addresses, addresses confirmed by a peer's dial-back, relay (circuit)
    addresses, then concrete bound addresses (wildcards expanded to interface IPs). Wildcard and link-local
    addresses are dropped; loopback addresses are kept only when every bound address is loopback (a node bound to
    127.0.0.1 is reachable by nothing else).
    """
    bound = list(bound)
    wild = any(scope(a) is Scope.WILDCARD for a in bound)
    concrete = expand(bound, (interface_ips() if wild else []) if ips is None else ips)
    loopback_only = bool(bound) and all(scope(a) is Scope.LOOPBACK for a in bound)
    out: list[str] = []
    for a in [*announce, *confirmed, *relayed, *concrete]:
        s = scope(a)
        if s in (Scope.WILDCARD, Scope.LINK_LOCAL) or (s is Scope.LOOPBACK and not loopback_only):
            continue
        if a not in out:
            out.append(a)
    return out[:MAX_ANNOUNCED]


def usable_from(addrs: Iterable[str], my_scopes: set[Scope]) -> list[str]:
    """Filter a remote peer's advertised addresses to those worth dialling from here: never wildcard or
    link-local; loopback only if this node itself listens on loopback. Relay addresses are kept."""
    out = []
    for a in addrs:
        s = scope(a)
        if s in (Scope.WILDCARD, Scope.LINK_LOCAL):
            continue
        if s is Scope.LOOPBACK and Scope.LOOPBACK not in my_scopes:
            continue
        out.append(a)
    return out
