"""Dialling peers and remembering their addresses: the dial half of :class:`node.p2p.host.P2PHost`
(:meth:`DialMethods.connect`, :meth:`~DialMethods.dial_addr`, :meth:`~DialMethods.stored_addrs`,
:meth:`~DialMethods.remember`), over py-libp2p's swarm and peerstore.

The host class mixes :class:`DialMethods` in, as it does :class:`node.p2p.streams.StreamMethods`; the attributes
and methods declared below are the host's. Which addresses are worth dialling, and racing them, is the network
service's (:mod:`node.net.dial`), handed to the host as ``peer_dialer``, ``circuit_dialer`` and ``dial_filter``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

import multiaddr
import trio

from .logs import reason

if TYPE_CHECKING:
    from libp2p.abc import IHost
    from libp2p.network.swarm import Swarm
    from libp2p.peer.id import ID

log = logging.getLogger("node.p2p.host")  # the host's logger: its lines keep their name

PARSED_CACHE = 1024  # /p2p/ multiaddrs whose parse :meth:`DialMethods.remember` keeps (presence gossip repeats them)


def swarm_of(host: IHost) -> Swarm:
    """The host's network, which ``libp2p.new_host`` always builds as a ``Swarm`` (``set_resource_manager`` and
    ``unblock_peer`` are the Swarm's, not in ``INetworkService``)."""
    return cast("Swarm", host.get_network())


class DialMethods:
    """The dial half of :class:`node.p2p.host.P2PHost` (module docstring), which sets the attributes below and
    defines the methods they call (``banned``, ``_require``)."""

    _peer_id: str
    # (peer, its addresses without /p2p/<peer>) -> connected? (None: every address in parallel)
    peer_dialer: Callable[[str, list[str]], Awaitable[bool]] | None
    circuit_dialer: Callable[[str], Awaitable[bool]] | None
    dial_filter: Callable[[list[str]], list[str]] | None
    # "/.../p2p/<id>" -> (ID, its string, [multiaddr])
    _parsed: dict[str, tuple[ID, str, list[multiaddr.Multiaddr]]]

    def banned(self, peer_id: str) -> bool:
        raise NotImplementedError  # the host's

    def _require(self) -> IHost:
        raise NotImplementedError  # the host's

    async def connect(self, multiaddrs: list[str], timeout: float = 10.0) -> int:
        """Dial every ``/.../p2p/<id>`` address in parallel (each dial ~0.25 s); failures are logged. With a
        :attr:`peer_dialer` (the network service's), each peer is dialled once by it instead: its reachable addresses
        raced, the first success cancelling the rest (an unreachable address no longer holds the call until
        ``timeout``).

        Addresses of this node itself are skipped. Peers already connected count as connected.

        Args:
            multiaddrs: full multiaddrs including ``/p2p/<peer id>``.
            timeout: seconds allowed per dial.

        Returns:
            The number of distinct peers connected among those addressed.
        """
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.peerinfo import info_from_p2p_addr

        host = self._require()
        ok: set[str] = set()
        if self.peer_dialer is not None:  # one race per peer: an unreachable address never holds up the others
            by_peer: dict[str, list[str]] = {}
            for a in multiaddrs:
                head, sep, pid = a.rpartition("/p2p/")
                if sep and pid != self._peer_id and not self.banned(pid):
                    by_peer.setdefault(pid, []).append(head)

            dialer = self.peer_dialer

            async def race_peer(pid: str, addrs: list[str]) -> None:
                with trio.move_on_after(timeout):
                    if await dialer(pid, addrs):
                        ok.add(pid)

            async with trio.open_nursery() as n:
                for pid, addrs in by_peer.items():
                    n.start_soon(race_peer, pid, addrs)
            return len(ok)

        async def dial(addr: str) -> None:
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
            except Exception as e:  # noqa: BLE001 - a bad address in any libp2p way is logged and skipped
                log.warning("bad peer address %r: %s", addr, reason(e))
                return
            pid = info.peer_id.to_base58()
            if pid == self._peer_id:
                return
            if self.banned(pid):  # its connection would be closed as it opens (node.p2p.limits)
                log.debug("not dialling %s: banned", pid)
                return
            try:
                if "/p2p-circuit" in addr:  # py-libp2p's connect() never dials these (node.net.relay)
                    if self.circuit_dialer is not None and await self.circuit_dialer(addr):
                        ok.add(pid)
                    return
                # Tally backs off per peer itself (node.net.peers); py-libp2p's 60 s negative cache would keep a
                # restarted server unreachable for a minute after one failed dial
                swarm_of(host).unblock_peer(info.peer_id)
                with trio.fail_after(timeout):
                    await host.connect(info)
                ok.add(pid)
            except Exception as e:  # noqa: BLE001 - dial errors come in many libp2p types; none may stop the others
                log.debug("connect to %s failed: %s", addr, reason(e))  # expected behind NATs: callers retry

        async with trio.open_nursery() as n:
            for a in multiaddrs:
                n.start_soon(dial, a)
        return len(ok)

    async def dial_addr(self, multiaddr_: str, timeout: float = 10.0) -> bool:
        """Open one connection to the peer of ``multiaddr_`` (``/ip4/../tcp/../p2p/<id>``) at that address only,
        in a single attempt (no py-libp2p retries, no negative cache). An existing connection counts.

        Returns:
            True when connected within ``timeout`` seconds; a failure is one DEBUG line with its reason.
        """
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.peerinfo import info_from_p2p_addr

        host = self._require()
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(multiaddr_))
        except Exception as e:  # noqa: BLE001 - a bad address in any libp2p way is not a peer address
            log.debug("not a peer address %r: %s", multiaddr_, reason(e))
            return False
        pid = info.peer_id
        if pid.to_base58() == self._peer_id or self.banned(pid.to_base58()):
            return False
        if pid in host.get_connected_peers():
            return True
        net = host.get_network()
        dial = getattr(net, "_dial_addr_single_attempt", None) or net.dial_addr  # py-libp2p 0.8.1: no retries
        try:
            with trio.fail_after(timeout):
                await dial(info.addrs[0], pid)
            return True
        except Exception as e:  # noqa: BLE001 - OSError, SwarmException, TooSlowError, Noise: that address failed
            log.debug("dial %s failed: %s", multiaddr_, reason(e))
            return pid in host.get_connected_peers()

    def stored_addrs(self, peer_id: str) -> list[str]:
        """The direct addresses py-libp2p's peerstore holds for ``peer_id`` (no ``/p2p``), [] if none."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.id import ID

        host = self._require()
        try:
            return [str(a) for a in host.get_peerstore().addrs(ID.from_base58(peer_id))
                    if "/p2p-circuit" not in str(a)]
        except Exception:  # noqa: BLE001 - a bad id or a missing entry: no addresses
            return []

    def remember(self, multiaddrs: list[str], ttl: int = 120) -> int:
        """Put ``/.../p2p/<id>`` addresses in the peerstore for ``ttl`` seconds, so a later stream to that peer
        dials it on demand (peers learn each other's addresses from gossip, not only from bootstrap).
        Bad addresses and our own are ignored. Returns how many were stored."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.peerinfo import info_from_p2p_addr

        host = self._require()
        n = 0
        if self.dial_filter is not None:  # never store what cannot be reached from here: py-libp2p would dial it
            multiaddrs = self.dial_filter(multiaddrs[:16])
        for addr in multiaddrs[:16]:
            parsed = self._parsed.get(addr)
            if parsed is None:
                try:
                    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
                except Exception:  # noqa: BLE001 - a bad address in any libp2p way is skipped
                    continue
                if len(self._parsed) >= PARSED_CACHE:
                    self._parsed.clear()
                parsed = self._parsed[addr] = (info.peer_id, info.peer_id.to_base58(), list(info.addrs))
            pid, pid_str, addrs = parsed
            if pid_str != self._peer_id:
                host.get_peerstore().add_addrs(pid, addrs, ttl)
                if pid not in host.get_connected_peers():
                    swarm_of(host).unblock_peer(pid)  # it is alive: it just told us so
                n += 1
        return n
