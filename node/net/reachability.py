"""Reachability: is this node dialable from outside, and at which addresses? (replaces py-libp2p's AutoNAT)

py-libp2p 0.8.1's AutoNAT "dials back" with ``host.connect()``, which returns at once over the requester's
existing connection, so it reports any address as reachable (`shared/notes/py-libp2p-network.md` §4). Tally's
dial-back opens a **new** connection (``network.dial_addr``, a full TCP + Noise handshake that proves the peer
ID) to each candidate address, then closes it.

Protocol ``/tally/dialback/1.0.0``: request ``{"addrs": [multiaddr, ...]}`` (at most 4); reply
``{"reachable": [...], "unreachable": [...]}``. Like libp2p AutoNAT (spec: autonat v1, "dial back only the
observed IP"), a server dials only addresses whose IP is the one the request came from, so it cannot be used to
make connections to third parties; it serves one request per peer per :data:`PER_PEER_INTERVAL` seconds and at
most :data:`MAX_CONCURRENT` at once.

The client (:func:`probe`) asks up to 3 connected peers and decides :class:`Reachability`: PUBLIC when a peer
reached one of its addresses, PRIVATE when peers answered and none did (then :mod:`node.net.relay` reserves a
relay slot), UNKNOWN when nobody answered.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from ..p2p.addrs import Scope, host_ip, scope
from ..p2p.framing import RemoteError

log = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "/tally/dialback/1.0.0"
PER_PEER_INTERVAL = 20.0  # seconds between two dial-backs for one peer
MAX_CONCURRENT = 4
MAX_TRACKED = 4096  # peers whose last dial-back is remembered (DialBackServer; oldest first out, and any older
# than PER_PEER_INTERVAL, which no longer limits anything)
DIAL_TIMEOUT = 5.0  # seconds per candidate address


class Reachability(enum.Enum):
    UNKNOWN = "unknown"
    PUBLIC = "public"  # some announced address was dialled back by a peer on a new connection
    PRIVATE = "private"  # peers tried and could not: behind a NAT or firewall


class Dialer(Protocol):
    """Opens a fresh, verified connection to ``peer`` at ``addr`` and closes it; True on success."""

    async def dial_fresh(self, peer: str, addr: str, timeout: float) -> bool: ...


class Requester(Protocol):
    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]: ...


class DialBackServer:
    """Serves dial-back requests (see module doc). ``clock``: monotonic seconds."""

    def __init__(self, dialer: Dialer, clock: Callable[[], float] = time.monotonic):
        self.dialer, self.clock = dialer, clock
        self._last: OrderedDict[str, float] = OrderedDict()  # peer -> its last dial-back, oldest first
        self._slots = trio.Semaphore(MAX_CONCURRENT)
        self.served = 0

    async def handle(self, msg: dict[str, Any], remote: str, remote_addr: tuple[str, int] | None) -> dict[str, Any]:
        """Dial back ``msg["addrs"]`` that share the requester's observed IP.

        Raises:
            RemoteError: ``bad_request`` (malformed), ``rate_limited`` (too soon), ``busy`` (no free slot).
        """
        addrs = msg.get("addrs")
        if not isinstance(addrs, list) or not addrs or len(addrs) > 4 or not all(
                isinstance(a, str) and len(a) < 128 for a in addrs):
            raise RemoteError("bad_request", "addrs: a list of 1..4 multiaddr strings")
        now = self.clock()
        if now - self._last.get(remote, -1e9) < PER_PEER_INTERVAL:
            raise RemoteError("rate_limited", f"one dial-back per {PER_PEER_INTERVAL:g} s")
        self._last.pop(remote, None)
        self._last[remote] = now
        while self._last and (len(self._last) > MAX_TRACKED or now - next(iter(self._last.values()))
                              >= PER_PEER_INTERVAL):
            self._last.popitem(last=False)
        seen_ip = remote_addr[0] if remote_addr else None
        ok: list[str] = []
        bad: list[str] = []
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            raise RemoteError("busy", "too many dial-backs in progress") from None
        try:
            for a in addrs:
                if seen_ip is None or host_ip(a) != seen_ip or scope(a) in (Scope.WILDCARD, Scope.RELAY):
                    bad.append(a)
                    continue
                (ok if await self.dialer.dial_fresh(remote, a, DIAL_TIMEOUT) else bad).append(a)
        finally:
            self._slots.release()
        self.served += 1
        return {"reachable": ok, "unreachable": bad}


async def probe(host: Requester, peers: list[str], candidates: list[str], timeout: float = 15.0
                ) -> tuple[Reachability, list[str]]:
    """Ask up to 3 of ``peers`` to dial ``candidates`` back (each peer gets the candidates with its view of our
    IP; see :class:`DialBackServer`).

    Returns:
        (reachability, the addresses some peer reached).
    """
    cands = [c for c in candidates if scope(c) not in (Scope.WILDCARD, Scope.RELAY, Scope.LOOPBACK)][:4]
    if not cands or not peers:
        return Reachability.UNKNOWN, []
    reached: list[str] = []
    answered = 0

    async def ask(peer: str) -> None:
        nonlocal answered
        try:
            reply = await host.request(peer, DIALBACK_PROTOCOL, {"addrs": cands}, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - RemoteError, unreachable, timeout: this peer tells nothing
            log.debug("dial-back via %s: %s: %s", peer, type(e).__name__, e)
            return
        answered += 1
        for a in reply.get("reachable", []) if isinstance(reply.get("reachable"), list) else []:
            if a in cands and a not in reached:
                reached.append(a)

    async with trio.open_nursery() as n:
        for p in peers[:3]:
            n.start_soon(ask, p)
    if reached:
        return Reachability.PUBLIC, reached
    return (Reachability.PRIVATE if answered else Reachability.UNKNOWN), []


async def dial_fresh(network: Any, peer: str, addr: str, timeout: float) -> bool:
    """Open a new connection to ``peer`` at ``addr`` with py-libp2p's swarm (TCP + Noise: the peer ID is
    verified), then close that connection only. True when it succeeded within ``timeout`` seconds."""
    conn = None
    try:
        with trio.fail_after(timeout):
            conn = await network.dial_addr(Multiaddr(addr), ID.from_base58(peer))
        return True
    except Exception as e:  # noqa: BLE001 - dial errors come in many libp2p types
        log.debug("dial-back to %s at %s failed: %s: %s", peer, addr, type(e).__name__, e)
        return False
    finally:
        if conn is not None:
            with trio.move_on_after(2.0):
                with contextlib.suppress(Exception):  # the probe's verdict is in; a failed close changes nothing
                    await conn.close()
