"""Circuit relay v2 and hole punching (py-libp2p's own implementations, driven by explicit calls).

* Every node runs the relay protocol's STOP side (it can be reached through a relay) and DCUtR (hole punching:
  a relayed connection is upgraded to a direct one where both NATs allow it). A node with ``hop=True`` (public
  nodes, ``--relay``) also relays for others, with limits: :data:`RELAY_LIMITS` (reservations, concurrent
  circuits, bytes and seconds per circuit) and :class:`GuardedRelayProtocol`'s rules: a reservation is only ever
  for the stream's authenticated remote peer (one per peer), at most :data:`MAX_RESERVATIONS_PER_IP` per remote
  IP, and a reservation ends with its holder's connection.
* **Full circuits for members only** (issue 23, finding 7): a circuit gets :data:`RELAY_LIMITS` (1 GiB, 1 hour)
  only when both its ends completed this genesis' hello with the relay (``member``); any other circuit gets
  circuit relay v2's defaults, :data:`OPEN_LIMITS` (2 minutes, 128 KiB: enough for DCUtR's hole punch, not for
  traffic), and non-members hold at most :data:`OPEN_RESERVATIONS` reservations in all.
* A node that is not publicly reachable (:class:`~node.net.reachability.Reachability` PRIVATE) reserves a slot on
  a connected relay and announces ``<relay addr>/p2p/<relay>/p2p-circuit``; the reservation is refreshed by the
  transport and re-made on another relay when the first one goes away.
* ``host.connect()`` never dials a ``/p2p-circuit`` address in py-libp2p 0.8.1 (notes §2): :meth:`Relay.dial`
  does it with the circuit transport.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Set as AbstractSet
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:  # mypy reads trio's types from trio-typing (a py-libp2p dependency) here
    from trio_typing import TaskStatus
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL, CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from ..p2p.addrs import Scope, scope, strip_peer
from ..p2p.logs import reason

log = logging.getLogger(__name__)

# A relay carries control traffic and small spans' hidden states; a circuit that needs more should hole-punch.
RELAY_LIMITS = RelayLimits(duration=3600, data=1 << 30, max_circuit_conns=32, max_reservations=32)
# reservations held at once by peers connected from one IP address (one machine, or one NAT): a host minting peer
# IDs cannot take more than this many of the RELAY_LIMITS.max_reservations slots
MAX_RESERVATIONS_PER_IP = 4
# circuits with an end that is not a member of this genesis: the circuit relay v2 defaults (specs/relay/circuit-v2.md,
# go-libp2p p2p/protocol/circuitv2/relay DefaultResources: Limit{Duration: 2 min, Data: 128 KiB})
OPEN_LIMITS = RelayLimits(duration=120, data=128 << 10, max_circuit_conns=RELAY_LIMITS.max_circuit_conns,
                          max_reservations=RELAY_LIMITS.max_reservations)
OPEN_RESERVATIONS = 4  # reservations held by non-members at once, of RELAY_LIMITS.max_reservations
MEMBER_WAIT = 5.0  # seconds a relay request waits for its peer's hello to complete before judging it a non-member
UNILATERAL_TIMEOUT = 3.0  # seconds DCUtR's plain dial of a (public-looking) peer may take before punching

Member = Callable[[str], Awaitable[bool]]  # peer ID -> completed this genesis' hello (may wait briefly)

# the limits of the circuit handled in the current task: py-libp2p reads ``self.limits`` several times per circuit,
# across awaits, so a per-task value (a context variable) rather than a swapped attribute
_CIRCUIT_LIMITS: contextvars.ContextVar[RelayLimits | None] = contextvars.ContextVar("tally_circuit_limits",
                                                                                      default=None)


class GuardedRelayProtocol(CircuitV2Protocol):
    """py-libp2p 0.8.1's circuit relay v2 with reservations bound to the authenticated remote peer.

    The stock ``_handle_reserve`` reserves for whatever ``peer.id`` the RESERVE message carries
    (``libp2p/relay/circuit_v2/protocol.py:511``), so one peer could fill every slot with made-up IDs, and a slot
    stays taken for the whole TTL after its holder disconnects. Here:

    * a RESERVE naming another peer than the stream's remote peer (the Noise-authenticated one) is answered
      PERMISSION_DENIED and reserves nothing; one without ``peer`` reserves for the remote peer. Reservations are
      keyed by peer ID, so each peer holds at most one (a second RESERVE refreshes it);
    * at most ``per_ip`` reservations are held by peers connected from one IP address (RESOURCE_LIMIT_EXCEEDED);
    * before each decision, reservations of peers no longer connected are dropped (circuit relay v2 spec: a
      reservation is valid only while its holder stays connected to the relay);
    * with ``member`` given, a circuit gets ``limits`` only when both ends are members, :data:`OPEN_LIMITS`
      otherwise, and non-members hold at most ``open_reservations`` reservations.

    Args:
        host: the py-libp2p ``IHost``.
        limits: ``RelayLimits`` (slots in all, bytes and seconds per circuit).
        allow_hop: relay for others (registers the HOP protocol).
        per_ip: reservations per remote IP address, >= 1.
        member: ``await member(peer_id)``: whether the peer completed this genesis' hello (None: everyone is
            treated as a member, the behaviour before issue 23).
        open_limits: a non-member circuit's limits.
        open_reservations: reservations non-members may hold at once, >= 0.

    Raises:
        ValueError: ``per_ip`` < 1 or ``open_reservations`` < 0.
    """

    def __init__(self, host: Any, limits: RelayLimits, allow_hop: bool, per_ip: int = MAX_RESERVATIONS_PER_IP,
                 member: Member | None = None, open_limits: RelayLimits = OPEN_LIMITS,
                 open_reservations: int = OPEN_RESERVATIONS):
        if per_ip < 1:
            raise ValueError(f"per_ip must be >= 1, got {per_ip}")
        if open_reservations < 0:
            raise ValueError(f"open_reservations must be >= 0, got {open_reservations}")
        super().__init__(host, limits=limits, allow_hop=allow_hop)
        self.per_ip = per_ip
        self.member, self.open_limits, self.open_reservations = member, open_limits, open_reservations
        self._members_of: dict[ID, bool] = {}  # reservation holder -> was a member when it reserved
        self.circuits = {"member": 0, "open": 0}  # circuits started, by kind
        self.refused_reservations = 0  # RESERVE requests answered with a refusal by the rules above
        self._ip_of: dict[ID, str | None] = {}  # reservation holder -> the IP it reserved from

    @property
    def limits(self) -> RelayLimits:
        """The limits py-libp2p applies: the current circuit's (set in :meth:`_handle_connect`), else the
        members' limits (reservations, and the relay resource manager's counts)."""
        return _CIRCUIT_LIMITS.get() or self._member_limits

    @limits.setter
    def limits(self, value: RelayLimits) -> None:
        self._member_limits = value

    async def _is_member(self, peer: ID) -> bool:
        if self.member is None:
            return True
        try:
            return bool(await self.member(peer.to_base58()))
        except Exception:  # noqa: BLE001 - whatever went wrong, the peer is not shown to be a member
            return False

    async def _handle_connect(self, stream: Any, msg: HopMessage) -> None:
        src = stream.muxed_conn.peer_id
        try:
            dst = ID(bytes(msg.peer.id))
        except Exception:  # noqa: BLE001 - a malformed peer ID: py-libp2p's handler refuses it
            dst = None
        full = dst is not None and await self._is_member(src) and await self._is_member(dst)
        self.circuits["member" if full else "open"] += 1
        token = _CIRCUIT_LIMITS.set(self._member_limits if full else self.open_limits)
        try:
            await super()._handle_connect(stream, msg)
        finally:
            _CIRCUIT_LIMITS.reset(token)

    def serves(self, peer: str) -> bool:
        """Whether ``peer`` holds a live reservation here or has a circuit through this relay."""
        try:
            pid = ID.from_base58(peer)
        except Exception:  # noqa: BLE001 - not a peer ID
            return False
        return self.resource_manager.get_reservation(pid) is not None or pid in self._active_relays

    def reservations(self) -> dict[str, str | None]:
        """Live reservations: holder peer ID -> the remote IP it reserved from (connected holders only)."""
        self._prune()
        return {p.to_base58(): self._ip_of.get(p) for p in list(self.resource_manager._reservations)
                if self.resource_manager.get_reservation(p) is not None}

    def _prune(self) -> None:
        """Drop reservations that expired or whose holder is no longer connected."""
        rm = self.resource_manager
        for pid in list(rm._reservations):  # py-libp2p 0.8.1 keeps them in this dict; no public removal
            if rm.get_reservation(pid) is None:
                del rm._reservations[pid]
        for pid in list(self._ip_of):
            if pid not in rm._reservations:
                del self._ip_of[pid]
        for pid in list(self._members_of):
            if pid not in rm._reservations:
                del self._members_of[pid]

    async def _refuse(self, stream: Any, code: StatusCode, why: str) -> None:
        self.refused_reservations += 1
        log.warning("relay: refused a reservation from %s: %s", stream.muxed_conn.peer_id, why)
        await self._send_status(stream, code, why)

    async def _handle_reserve(self, stream: Any, msg: HopMessage) -> None:
        remote = stream.muxed_conn.peer_id
        if msg.HasField("peer") and msg.peer.id and bytes(msg.peer.id) != remote.to_bytes():
            try:
                named = ID(bytes(msg.peer.id)).to_base58()
            except Exception:  # noqa: BLE001 - a peer's bytes: any decode error means unnamed
                named = bytes(msg.peer.id[:16]).hex() + "..."
            await self._refuse(stream, StatusCode.PERMISSION_DENIED, f"reservation for another peer ({named})")
            return
        self._prune()
        ip = _remote_ip(stream)
        if self.resource_manager.get_reservation(remote) is None and ip is not None:
            held = sum(1 for v in self._ip_of.values() if v == ip)
            if held >= self.per_ip:
                await self._refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED,
                                   f"{held} reservations already held from {ip} (limit {self.per_ip})")
                return
        member = await self._is_member(remote)
        if not member and self.resource_manager.get_reservation(remote) is None:
            held = sum(1 for p, m in self._members_of.items() if not m and p != remote)
            if held >= self.open_reservations:
                await self._refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED,
                                   f"{held} reservations already held by non-members (limit {self.open_reservations})")
                return
        msg.ClearField("peer")  # the stock handler then reserves for the stream's remote peer
        self._ip_of[remote] = ip  # before: the stock handler lingers 0.1 s after its reply
        self._members_of[remote] = member
        token = _CIRCUIT_LIMITS.set(self._member_limits if member else self.open_limits)  # the reply's limit
        try:
            await super()._handle_reserve(stream, msg)
        finally:
            _CIRCUIT_LIMITS.reset(token)
            if remote not in self.resource_manager._reservations:
                self._ip_of.pop(remote, None)
                self._members_of.pop(remote, None)


class TallyDCUtR(DCUtRProtocol):
    """py-libp2p 0.8.1's DCUtR without the slow first step for peers behind NATs (issue 25).

    Before every hole punch py-libp2p tries a "unilateral upgrade": a plain dial of every direct address the
    peerstore holds for the peer, waiting up to its 10 s dial timeout (``dcutr.py:488``). For a peer that announces
    a relay circuit — it told us it cannot be dialled — those addresses are its private interface addresses and
    its NAT's address, where a home router silently drops the SYN: every attempt waited 10 s before punching. Here
    that step is skipped for such peers (``private(peer) -> True``) and bounded by :data:`UNILATERAL_TIMEOUT` for
    the others; the hole punch itself (CONNECT, SYNC, simultaneous dials from the listen port: libp2p DCUtR spec)
    is py-libp2p's.

    py-libp2p drives a hole punch from *both* ends of a relayed connection every 2 s; two sessions started at once
    dial each other twice, each side once as the Noise initiator and once as the responder, and a simultaneous
    open then fails the handshake (measured: D's connections to both servers stayed relayed once the slow first
    step no longer staggered the two ends). Here one end drives, as the DCUtR spec says: the one that *accepted*
    the relayed connection ("B ... opens a stream to A", specs/relay/DCUtR.md); with relayed connections in both
    directions, the end with the smaller peer ID. The other end answers CONNECT as before.

    Args:
        host: the py-libp2p host.
        private: ``private(peer_id_str)``: the peer announces a circuit address (None: never skip).
    """

    def __init__(self, host: Any, private: Callable[[str], bool] | None = None):
        super().__init__(host)
        self.private = private
        self.skipped_unilateral = 0  # unilateral upgrades not tried: the peer is behind a NAT

    def drives(self, peer_id: ID) -> bool:
        """Whether this end starts the hole punch with ``peer_id`` (see the class doc)."""
        dirs = set()
        for c in self.host.get_network().get_connections(peer_id):
            addrs = [str(a) for a in _transport_addrs(c)]
            if addrs and all("/p2p-circuit" in a for a in addrs):
                dirs.add(bool(getattr(getattr(c, "muxed_conn", None), "is_initiator", False)))
        if dirs == {True}:
            return False  # we dialled the circuit: the peer that accepted it drives
        if dirs == {True, False}:
            return self.host.get_id().to_base58() < peer_id.to_base58()
        return True

    async def initiate_hole_punch(self, peer_id: ID) -> bool:
        if not self.drives(peer_id):
            return False
        return await super().initiate_hole_punch(peer_id)

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        if self.private is not None and self.private(peer_id.to_base58()):
            self.skipped_unilateral += 1
            return False
        with trio.move_on_after(UNILATERAL_TIMEOUT):
            return await super()._try_unilateral_upgrade(peer_id)
        return False


def _transport_addrs(conn: Any) -> list[str]:
    try:
        return list(conn.get_transport_addresses())
    except Exception:  # noqa: BLE001 - a closing connection
        return []


def _remote_ip(stream: Any) -> str | None:
    try:
        a = stream.get_remote_address()
        return str(a[0]) if a else None
    except Exception:  # noqa: BLE001 - libp2p's stream types differ: no address is the answer
        return None


class Relay:
    """Relay roles of one node. Use :meth:`running` inside the host's lifetime.

    Args:
        host: the running py-libp2p host (``IHost``).
        hop: relay for others (public nodes).
        dcutr: run hole punching (:class:`TallyDCUtR`).
        per_ip: reservations this relay grants to peers of one remote IP (:class:`GuardedRelayProtocol`).
        member: ``await member(peer_id)``: the peer completed this genesis' hello (full circuits); None: all are.
        private: ``private(peer_id)``: the peer announces a circuit (DCUtR skips its plain dial); None: never.
    """

    def __init__(self, host: Any, hop: bool, dcutr: bool = True, per_ip: int = MAX_RESERVATIONS_PER_IP,
                 member: Member | None = None, private: Callable[[str], bool] | None = None):
        self.host, self.hop, self.dcutr, self.private = host, hop, dcutr, private
        self.protocol = GuardedRelayProtocol(host, limits=RELAY_LIMITS, allow_hop=hop, per_ip=per_ip,
                                             member=member)
        self.transport: CircuitV2Transport | None = None
        self.dialer: CircuitV2Transport | None = None
        self.reserved_on: str | None = None  # relay peer ID holding our reservation
        self.circuit_addrs: list[str] = []  # what we announce while reserved

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the relay protocol (and DCUtR) until cancelled."""
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(background_trio_service(self.protocol))
            if self.dcutr:
                await stack.enter_async_context(background_trio_service(TallyDCUtR(self.host, self.private)))
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            # reserving needs the CLIENT role; a CLIENT transport also reserves on every dial (notes §2), so
            # dialling goes through a second, STOP-only transport
            self.transport = CircuitV2Transport(self.host, self.protocol,
                                                RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT))
            self.dialer = CircuitV2Transport(self.host, self.protocol, RelayConfig(roles=RelayRole.STOP))
            task_status.started()
            await trio.sleep_forever()

    def serves(self, peer: str) -> bool:
        """Whether this relay holds a reservation for ``peer`` or carries a circuit of it."""
        return self.hop and self.protocol.serves(peer)

    def relays(self) -> list[str]:
        """Connected peers that offer the relay HOP protocol (identify has run)."""
        out = []
        ps = self.host.get_peerstore()
        for pid in self.host.get_connected_peers():
            try:
                if HOP_PROTOCOL in ps.get_protocols(pid):
                    out.append(pid.to_base58())
            except Exception:  # noqa: BLE001 - a peerstore entry may vanish or be odd: skip that peer
                continue
        return sorted(out)

    def relay_addr(self, relay: str) -> str | None:
        """A direct (non-relay, non-loopback unless we are loopback) address of ``relay`` we are connected at."""
        pid = ID.from_base58(relay)
        for conn in self.host.get_network().get_connections(pid):
            for a in conn.get_transport_addresses():
                s = str(a)
                if "/p2p-circuit" not in s:
                    return strip_peer(s)
        for a in self.host.get_peerstore().addrs(pid):
            s = str(a)
            if scope(s) not in (Scope.WILDCARD, Scope.RELAY):
                return strip_peer(s)
        return None

    async def reserve(self, exclude: AbstractSet[str] = frozenset()) -> str | None:
        """Reserve a slot on one connected relay (not in ``exclude``). Returns its peer ID, or None.

        On success :attr:`circuit_addrs` holds ``<relay addr>/p2p/<relay>/p2p-circuit``."""
        if self.transport is None:
            return None
        for relay in self.relays():
            if relay in exclude or relay == self.host.get_id().to_base58():
                continue
            if self.private is not None and self.private(relay):
                continue  # it announces a circuit itself: behind a NAT, only peers that punched to it reach it
            addr = self.relay_addr(relay)
            if addr is None:
                continue
            try:
                with trio.fail_after(10):
                    stream = await self.host.new_stream(ID.from_base58(relay), [HOP_PROTOCOL])
                    ok = await self.transport.reserve(stream, ID.from_base58(relay), self._nursery)
                    await stream.close()
            except Exception as e:  # noqa: BLE001 - a relay failing in any libp2p way: try the next
                log.debug("reservation on %s failed: %s: %s", relay, type(e).__name__, e)
                continue
            if ok:
                self.reserved_on = relay
                self.circuit_addrs = [f"{addr}/p2p/{relay}/p2p-circuit"]
                log.info("not publicly reachable: reserved a relay slot on %s, announcing %s", relay,
                         self.circuit_addrs[0])
                return relay
        return None

    def still_reserved(self) -> bool:
        """Whether the relay holding our reservation is still connected."""
        if self.reserved_on is None:
            return False
        return ID.from_base58(self.reserved_on) in self.host.get_connected_peers()

    def drop_reservation(self) -> None:
        self.reserved_on, self.circuit_addrs = None, []

    async def dial(self, circuit_addr: str, timeout: float = 20.0) -> bool:
        """Connect through a relay: ``circuit_addr`` is ``.../p2p/<relay>/p2p-circuit/p2p/<target>``. The relay
        is dialled first if needed. True when a (relayed) connection to the target exists afterwards."""
        if self.dialer is None:
            return False
        try:
            with trio.fail_after(timeout):
                await self.dialer.dial(Multiaddr(circuit_addr))
            return True
        except Exception as e:  # noqa: BLE001 - dial errors come in many libp2p types
            log.debug("relayed dial %s failed: %s", circuit_addr, reason(e))
            return False
