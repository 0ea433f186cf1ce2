"""Circuit relay v2 and hole punching (py-libp2p's own implementations, driven by explicit calls).

* Every node runs the relay protocol's STOP side (it can be reached through a relay) and DCUtR (hole punching:
  a relayed connection is upgraded to a direct one where both NATs allow it). A node with ``hop=True`` (public
  nodes, ``--relay``) also relays for others, with limits: :data:`RELAY_LIMITS` (reservations, concurrent
  circuits, bytes and seconds per circuit).
* A node that is not publicly reachable (:class:`~node.net.reachability.Reachability` PRIVATE) reserves a slot on
  a connected relay and announces ``<relay addr>/p2p/<relay>/p2p-circuit``; the reservation is refreshed by the
  transport and re-made on another relay when the first one goes away.
* ``host.connect()`` never dials a ``/p2p-circuit`` address in py-libp2p 0.8.1 (notes §2): :meth:`Relay.dial`
  does it with the circuit transport.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from .addrs import Scope, scope, strip_peer

log = logging.getLogger(__name__)

# A relay carries control traffic and small spans' hidden states; a circuit that needs more should hole-punch.
RELAY_LIMITS = RelayLimits(duration=3600, data=1 << 30, max_circuit_conns=32, max_reservations=32)


class Relay:
    """Relay roles of one node. Use :meth:`running` inside the host's lifetime.

    Args:
        host: the running py-libp2p host (``IHost``).
        hop: relay for others (public nodes).
        dcutr: run hole punching.
    """

    def __init__(self, host: Any, hop: bool, dcutr: bool = True):
        self.host, self.hop, self.dcutr = host, hop, dcutr
        self.protocol = CircuitV2Protocol(host, limits=RELAY_LIMITS, allow_hop=hop)
        self.transport = self.dialer = None
        self.reserved_on: str | None = None  # relay peer ID holding our reservation
        self.circuit_addrs: list[str] = []  # what we announce while reserved

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the relay protocol (and DCUtR) until cancelled."""
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(background_trio_service(self.protocol))
            if self.dcutr:
                await stack.enter_async_context(background_trio_service(DCUtRProtocol(self.host)))
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            # reserving needs the CLIENT role; a CLIENT transport also reserves on every dial (notes §2), so
            # dialling goes through a second, STOP-only transport
            self.transport = CircuitV2Transport(self.host, self.protocol,
                                                RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT))
            self.dialer = CircuitV2Transport(self.host, self.protocol, RelayConfig(roles=RelayRole.STOP))
            task_status.started()
            await trio.sleep_forever()

    def relays(self) -> list[str]:
        """Connected peers that offer the relay HOP protocol (identify has run)."""
        out = []
        ps = self.host.get_peerstore()
        for pid in self.host.get_connected_peers():
            try:
                if HOP_PROTOCOL in ps.get_protocols(pid):
                    out.append(pid.to_base58())
            except Exception:
                continue
        return sorted(out)

    def relay_addr(self, relay: str) -> str | None:
        """A direct (non-relay, non-loopback unless we are loopback) address of ``relay`` we are connected at."""
        pid = ID.from_base58(relay)
        for conn in self.host.get_network().get_connections(pid) if hasattr(
                self.host.get_network(), "get_connections") else []:
            for a in conn.get_transport_addresses():
                s = str(a)
                if "/p2p-circuit" not in s:
                    return strip_peer(s)
        for a in self.host.get_peerstore().addrs(pid):
            s = str(a)
            if scope(s) not in (Scope.WILDCARD, Scope.RELAY):
                return strip_peer(s)
        return None

    async def reserve(self, exclude: set[str] = frozenset()) -> str | None:
        """Reserve a slot on one connected relay (not in ``exclude``). Returns its peer ID, or None.

        On success :attr:`circuit_addrs` holds ``<relay addr>/p2p/<relay>/p2p-circuit``."""
        if self.transport is None:
            return None
        for relay in self.relays():
            if relay in exclude or relay == self.host.get_id().to_base58():
                continue
            addr = self.relay_addr(relay)
            if addr is None:
                continue
            try:
                with trio.fail_after(10):
                    stream = await self.host.new_stream(ID.from_base58(relay), [HOP_PROTOCOL])
                    ok = await self.transport.reserve(stream, ID.from_base58(relay), self._nursery)
                    await stream.close()
            except Exception as e:
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
        except Exception as e:
            log.debug("relayed dial %s failed: %s: %s", circuit_addr, type(e).__name__, e)
            return False
