"""The node's network service: handshake, peer discovery and redial, reachability and relays, on one host.

:class:`NetworkService` runs beside the ledger and the span server (:mod:`node.runtime`):

1. **Handshake** (:mod:`node.net.hello`) on every connection; Tally protocols wait for it (the host's gate).
2. **Discovery**: bootstrap addresses (genesis file and ``--bootstrap``) and the saved address book
   (:mod:`node.net.peers`) are dialled at start; each verified peer is asked for the peers it knows
   (``/tally/peers/1.0.0``); presence gossip adds every node of the swarm (:meth:`learn`). The node keeps at
   least :attr:`target` connections, redialling dropped peers with backoff.
3. **Reachability** (:mod:`node.net.reachability`): once connected, peers dial the announced addresses back on new
   connections. PUBLIC nodes relay for others (:mod:`node.net.relay`); PRIVATE ones reserve a relay slot and
   announce the circuit address, and DCUtR upgrades relayed connections where the NATs allow.
4. **Dialling** (:mod:`node.net.dial`, issue 25): only addresses reachable from here, raced happy-eyeballs style
   with a relay circuit among the candidates from the start; the address that worked is remembered per peer
   (:mod:`node.net.paths`), which also keeps each connected peer's path (direct or relayed) and ping round trip
   for :meth:`NetworkService.status` (``/v1/status``, ``node peers``).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import Callable, Sequence, Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:  # mypy reads trio's types from trio-typing (a py-libp2p dependency) here
    from trio_typing import TaskStatus

from ..p2p.addrs import Scope, scope, strip_peer, usable_from
from ..p2p.framing import RemoteError, error_reply, read_msg, write_msg
from ..p2p.host import P2PHost
from ..p2p.logs import reason
from ..p2p.scoring import BAD_REQUEST
from .dial import LocalView, local_view, race, select
from .hello import HELLO_PROTOCOL, Hello
from .paths import PathBook, describe
from .peers import PeerBook
from .reachability import DIALBACK_PROTOCOL, DialBackServer, Reachability, dial_fresh, probe
from .relay import MEMBER_WAIT, Relay

log = logging.getLogger(__name__)

PEERS_PROTOCOL = "/tally/peers/1.0.0"
MAX_EXCHANGED = 32  # peers per exchange reply
TICK = 1.0  # seconds between connection-manager passes
PROBE_PERIOD = 300.0  # seconds between reachability re-checks once decided
DIAL_TIMEOUT = 10.0  # seconds one address's dial may take (the others race meanwhile: node.net.dial.race)
VIEW_TTL = 30.0  # seconds this node's view of its own interfaces and routes is reused
PING_PERIOD = 10.0  # seconds between two round-trip measurements of the connected peers
MAX_PINGED = 32  # peers pinged per round
PING_FAILS = 3  # pings in a row a connected peer may miss before its connections are closed (and redialled)


class RelayMode(enum.Enum):
    AUTO = "auto"  # relay for others when publicly reachable
    ON = "on"
    OFF = "off"


def _remote_addr(stream: Any) -> tuple[str, int] | None:
    try:
        a = stream.get_remote_address()
        return (str(a[0]), int(a[1])) if a else None
    except Exception:  # noqa: BLE001 - libp2p's stream types differ: no address is the answer
        return None


class NetworkService:
    """Discovery, handshake, reachability and relays for one :class:`~node.p2p.host.P2PHost`.

    Args:
        host: the node's host (not yet running; handlers are registered here).
        genesis_hash: 32 bytes; ``chain_id`` is the host's.
        bootstrap: ``/.../p2p/<id>`` multiaddrs dialled at start and redialled whenever disconnected.
        data_dir: where ``peers.json`` lives (None: nothing saved).
        relay: :class:`RelayMode`.
        target: connections the node keeps at least (if it knows enough peers).
        dcutr: run hole punching (DCUtR).
    """

    def __init__(self, host: P2PHost, genesis_hash: bytes, bootstrap: Sequence[str] = (),
                 data_dir: Path | None = None, relay: RelayMode = RelayMode.AUTO, target: int = 8,
                 dcutr: bool = True):
        self.host = host
        self.hello = Hello(host.chain_id, genesis_hash, host, on_verified=self.learn)
        self.book = PeerBook(data_dir / "peers.json" if data_dir is not None else None)
        self.bootstrap = list(bootstrap)
        self.relay_mode = relay
        self.target = target
        self.dcutr = dcutr
        self.reachability = Reachability.UNKNOWN
        self.relay: Relay | None = None
        self.dialback = DialBackServer(self)
        self._connecting: set[str] = set()  # dials in flight (bounded by the tasks running them)
        self._greeting: set[str] = set()  # handshakes in flight (bounded by the tasks running them)
        self._exchanged: set[str] = set()  # connected peers asked for peers (removed on disconnect)
        self._changed = trio.Event()
        self.paths = PathBook()
        self._ping_fails: dict[str, int] = {}  # connected peer -> pings missed in a row (removed on disconnect)
        self.on_rtt: Callable[[str, float], None] | None = None  # (peer, seconds) per ping, e.g. to the router
        self._view: tuple[float, LocalView] | None = None
        now = time.time()
        for a in self.bootstrap:
            peer, addr = a.rsplit("/p2p/", 1)[1], strip_peer(a)
            self.book.add(peer, [addr], now, bootstrap=True)
            ip = addr.split("/")[2] if addr.split("/")[1] in ("ip4", "ip6") else None
            host.reserve(peers=[peer], ips=[ip] if ip else [])  # slots kept for bootstrap peers
        host.is_member = self._may_stay  # connections of peers that never say hello are closed
        host.gate = self._gate
        host.open_gate.add(HELLO_PROTOCOL)
        host.set_handler(HELLO_PROTOCOL, self._handle_hello)
        host.set_handler(DIALBACK_PROTOCOL, self._handle_dialback)
        host.set_request_handler(PEERS_PROTOCOL, self._handle_peers, timeout=10.0)
        host.on_connected.append(self._on_connected)
        host.on_disconnected.append(self._on_disconnected)
        host.circuit_dialer = self._dial_circuit
        host.dial_hint = self._dial_known
        host.dial_filter = self._dialable
        host.peer_dialer = self.dial_peer

    def _may_stay(self, peer: str) -> bool:
        """Whether ``peer`` may keep its connections: it completed the hello, or the relay serves it."""
        return self.hello.verified(peer) or (self.relay is not None and self.relay.serves(peer))

    # ------------------------------------------------------------------ handlers

    async def _gate(self, peer: str, protocol: str) -> bool:
        if not self.hello.verified(peer) and peer not in self._greeting and peer not in self.hello.refused:
            self.host.spawn(self._greet, peer)  # a handshake lost to a timeout is retried on demand
        return await self.hello.wait_verified(peer)

    async def _handle_hello(self, stream: Any, remote: str) -> None:
        msg = await read_msg(stream, 10.0)
        try:
            reply = await self.hello.handle(msg, remote, _remote_addr(stream))
        except RemoteError as e:
            await write_msg(stream, error_reply(e.code, e.message), timeout=5.0)
            self.book.refuse(remote)
            return
        reply["status"] = "ok"
        await write_msg(stream, reply, timeout=5.0)

    async def _handle_dialback(self, stream: Any, remote: str) -> None:
        msg = await read_msg(stream, 10.0)
        try:
            reply = await self.dialback.handle(msg, remote, _remote_addr(stream))
            reply["status"] = "ok"
        except RemoteError as e:
            reply = error_reply(e.code, e.message)
        await write_msg(stream, reply, timeout=5.0)

    async def _handle_peers(self, msg: dict[str, Any], remote: str) -> dict[str, Any]:
        connected = set(self.host.connected_peers())
        rows = [{"peer": p, "addrs": usable_from(a, {Scope.LOOPBACK})[:4]}
                for p, a in self.book.sample(MAX_EXCHANGED + 1, connected) if p != remote]
        return {"peers": rows[:MAX_EXCHANGED]}

    async def dial_fresh(self, peer: str, addr: str, timeout: float) -> bool:
        """:class:`~node.net.reachability.Dialer` for the dial-back server."""
        return await dial_fresh(self.host.libp2p.get_network(), peer, addr, timeout)

    # ------------------------------------------------------------------ connections

    def _on_connected(self, peer: str, conn: Any) -> None:
        self.book.connected(peer, time.time())
        with contextlib.suppress(RuntimeError):  # shutting down
            self.host.spawn(self._greet, peer)

    def _on_disconnected(self, peer: str, conn: Any) -> None:
        if peer not in self.host.connected_peers():
            self.hello.forget(peer)
            self._exchanged.discard(peer)
            self.paths.disconnected(peer)
            self._ping_fails.pop(peer, None)
        self._changed.set()

    async def _greet(self, peer: str) -> None:
        if peer in self._greeting:
            return
        self._greeting.add(peer)
        try:
            ok = await self.hello.greet(peer)
        finally:
            self._greeting.discard(peer)
        if ok:
            # only while connected: _on_disconnected, which forgets it, may have run during the handshake
            if peer not in self._exchanged and peer in self.host.connected_peers():
                self._exchanged.add(peer)
                await self._exchange(peer)
            self._changed.set()
        elif peer in self.hello.refused:
            self.book.refuse(peer)
            await self.host.disconnect(peer)

    async def _exchange(self, peer: str) -> None:
        try:
            reply = await self.host.request(peer, PEERS_PROTOCOL, {"want": MAX_EXCHANGED}, timeout=10.0)
        except Exception as e:  # noqa: BLE001 - an old or busy peer: discovery goes on through gossip
            log.debug("peer exchange with %s: %s", peer, reason(e))
            return
        rows = reply.get("peers")
        if not isinstance(rows, list):
            self.host.penalize(peer, BAD_REQUEST)
            return
        now = time.time()
        for r in rows[:MAX_EXCHANGED]:
            if isinstance(r, dict) and isinstance(r.get("peer"), str) and isinstance(r.get("addrs"), list):
                self.learn(r["peer"], [a for a in r["addrs"][:4] if isinstance(a, str) and len(a) < 256], now)

    def learn(self, peer: str, addrs: list[str], now: float | None = None) -> None:
        """Add ``peer`` at ``addrs`` (with or without ``/p2p/<peer>``) to the address book, keeping only
        addresses this node could dial. Our own ID is ignored."""
        if peer == self.host.peer_id or len(peer) > 64:
            return
        try:
            mine = {scope(a) for a in self.host.bound_addrs()}
        except RuntimeError:
            mine = set()
        clean = usable_from([strip_peer(a) for a in addrs if "/p2p/" not in a or a.endswith("/p2p-circuit")
                             or a.rsplit("/p2p/", 1)[-1] == peer], mine)
        if clean:
            self.book.add(peer, clean, time.time() if now is None else now)
            self.host.remember([f"{a}/p2p/{peer}" for a in clean if "/p2p-circuit" not in a])

    def local_view(self) -> LocalView:
        """This node's :class:`~node.net.dial.LocalView` (interfaces, routes), re-read every :data:`VIEW_TTL` s."""
        now = time.monotonic()
        if self._view is None or now - self._view[0] > VIEW_TTL:
            try:
                bound = self.host.bound_addrs()
            except RuntimeError:
                bound = []
            self._view = (now, local_view(bound))
        return self._view[1]

    def announces_circuit(self, peer: str) -> bool:
        """Whether ``peer`` told us a relay circuit address: it is behind a NAT and cannot be dialled directly."""
        e = self.book.peers.get(peer)
        return e is not None and any("/p2p-circuit" in a for a in e.addrs)

    def _dialable(self, addrs: list[str]) -> list[str]:
        """Of ``/.../p2p/<id>`` addresses, those :func:`~node.net.dial.select` would dial (for the host's
        ``remember``: py-libp2p's peerstore then never holds an address that cannot be reached from here)."""
        by_peer: dict[str, list[str]] = {}
        for a in addrs:
            if "/p2p/" in a:
                peer = a.rsplit("/p2p/", 1)[1]
                by_peer.setdefault(peer, []).append(strip_peer(a))
        out: list[str] = []
        for peer, plain in by_peer.items():
            e = self.book.peers.get(peer)
            known = plain + (e.addrs if e is not None else [])
            keep = set(select(known, self.local_view(), limit=len(known)))
            out.extend(f"{a}/p2p/{peer}" for a in plain if a in keep)
        return out

    def candidates(self, peer: str, addrs: Sequence[str] = ()) -> list[str]:
        """The addresses of ``peer`` worth dialling now, best first: ``addrs`` and those in the address book,
        filtered and ordered by :func:`~node.net.dial.select` (the path that worked last first)."""
        e = self.book.peers.get(peer)
        known = list(dict.fromkeys([*addrs, *(e.addrs if e is not None else [])]))
        return select(known, self.local_view(), self.paths.remembered(peer))

    async def _attempt(self, peer: str, addr: str) -> bool:
        """One candidate of a race: dial ``peer`` at ``addr`` (direct, or through the relay of a circuit)."""
        if peer in self.host.connected_peers():
            return True
        if "/p2p-circuit" in addr:
            return await self._dial_circuit(f"{addr}/p2p/{peer}")
        return await self.host.dial_addr(f"{addr}/p2p/{peer}", DIAL_TIMEOUT)

    async def dial_peer(self, peer: str, addrs: Sequence[str] = ()) -> bool:
        """Connect ``peer`` by racing :meth:`candidates` (happy eyeballs, :func:`node.net.dial.race`). True when a
        connection exists afterwards; the winning address is remembered. A failure is one DEBUG line."""
        if peer in self.host.connected_peers():
            return True
        cands = self.candidates(peer, list(addrs))
        if not cands:
            log.debug("dial %s: no address reachable from here (known: %s)", peer,
                      ", ".join(addrs) or "none")
            return False
        won = await race(cands, lambda a: self._attempt(peer, a))
        if won is not None:
            self.paths.worked(peer, won)
            return True
        remembered = self.paths.remembered(peer)
        if remembered is not None:
            self.paths.forget(peer, remembered)
        log.debug("dial %s failed at every candidate: %s", peer, ", ".join(cands))
        return peer in self.host.connected_peers()

    async def _dial(self, peer: str, addrs: list[str]) -> None:
        self._connecting.add(peer)
        try:
            if await self.dial_peer(peer, addrs):
                self.book.connected(peer, time.time())
            else:
                delay = self.book.failed(peer, time.time())
                log.debug("dial %s failed; next try in %.1f s", peer, delay)
        finally:
            self._connecting.discard(peer)

    async def _dial_known(self, peer: str) -> bool | None:
        """Before a stream to an unconnected peer: connect it at the addresses the book and py-libp2p's peerstore
        hold (:meth:`dial_peer`). True: connected; False: every candidate failed; None: no address known."""
        e = self.book.peers.get(peer)
        if e is not None and e.refused:
            return False
        stored = self.host.stored_addrs(peer)
        if (e is None or not e.addrs) and not stored:
            return None
        return await self.dial_peer(peer, stored)

    async def _dial_circuit(self, addr: str) -> bool:
        if self.relay is None:
            return False
        relay_part = addr.split("/p2p-circuit", 1)[0]
        relay_peer = relay_part.rsplit("/p2p/", 1)[-1]
        if relay_peer not in self.host.connected_peers() and not await self.host.dial_addr(relay_part, DIAL_TIMEOUT):
            return False
        return await self.relay.dial(addr)

    def _target(self) -> int:
        """Connections to keep beyond the bootstrap peers: :attr:`target`, or none for a node bound to loopback
        alone (every peer is on this machine and gossip reaches them through the bootstrap peers; a full mesh
        would only multiply gossip work on one CPU — measured: a 11-node test swarm ran 2x slower)."""
        if all(scope(a) is Scope.LOOPBACK for a in self.host.bound_addrs()):
            return 0
        return self.target

    async def _manage(self) -> None:
        """Keep bootstrap peers and at least :attr:`target` peers connected; redial with backoff."""
        saved = 0.0
        while True:
            connected = set(self.host.connected_peers())
            want = max(0, self._target() - len(connected))
            due = self.book.due(time.time(), connected | self._connecting, 16)
            boot = [(p, a) for p, a in due if self.book.peers[p].bootstrap]
            rest = [(p, a) for p, a in due if not self.book.peers[p].bootstrap][:want]
            for peer, addrs in (boot + rest)[:8]:
                self.host.spawn(self._dial, peer, addrs)
            if time.monotonic() - saved > 30.0:
                saved = time.monotonic()
                self._save()
            self._changed = trio.Event()
            with trio.move_on_after(TICK):
                await self._changed.wait()

    def _save(self) -> None:
        try:
            self.book.save()
        except OSError as e:
            log.warning("could not save the address book: %s", reason(e))

    # ------------------------------------------------------------------ reachability and relays

    def _candidates(self) -> list[str]:
        """Addresses to have dialled back: announced direct ones, and the observed IP with each bound port."""
        out = [a for a in self.host.announced() if scope(a) not in (Scope.RELAY, Scope.LOOPBACK)]
        ports = {a.split("/")[4] for a in self.host.bound_addrs() if len(a.split("/")) > 4}
        for obs in self.hello.observed.values():
            parts = obs.split("/")
            if len(parts) > 4 and scope(obs) not in (Scope.LOOPBACK, Scope.WILDCARD):
                out.extend(f"/{parts[1]}/{parts[2]}/tcp/{p}" for p in sorted(ports))
        return list(dict.fromkeys(out))[:4]

    async def _reachability_loop(self) -> None:
        if all(scope(a) is Scope.LOOPBACK for a in self.host.bound_addrs()):
            return  # a loopback-only node (devnet, tests) is reachable from this machine only
        while True:
            peers = [p for p in self.host.connected_peers() if self.hello.verified(p)
                     and p != (self.relay.reserved_on if self.relay else None)]
            if not peers:
                await trio.sleep(TICK)
                continue
            status, reached = await probe(self.host, sorted(peers), self._candidates())
            if status is not Reachability.UNKNOWN and status is not self.reachability:
                log.info("reachability: %s%s", status.value, f" at {', '.join(reached)}" if reached else "")
            if status is not Reachability.UNKNOWN:
                self.reachability = status
                self.host.confirmed_addrs = reached
            if status is Reachability.PRIVATE and self.relay is not None and not self.relay.still_reserved():
                await self._rereserve()
            await trio.sleep(PROBE_PERIOD if status is not Reachability.UNKNOWN else 5.0)

    async def _relay_watch(self) -> None:
        """Re-reserve when the relay holding our slot goes away."""
        while True:
            await trio.sleep(2.0)
            if self.relay is not None and self.relay.reserved_on and not self.relay.still_reserved():
                log.info("relay %s went away; reserving elsewhere", self.relay.reserved_on)
                await self._rereserve(exclude={self.relay.reserved_on})

    async def _rereserve(self, exclude: AbstractSet[str] = frozenset()) -> bool:
        """Drop our reservation (and stop announcing its circuit address), reserve on a connected relay not in
        ``exclude``, and announce the new circuit address. True when a slot was reserved."""
        if self.relay is None:
            return False
        self.relay.drop_reservation()
        self.host.relay_addrs = []
        if await self.relay.reserve(exclude=set(exclude)):
            self.host.relay_addrs = list(self.relay.circuit_addrs)
            return True
        return False

    def peers(self) -> list[dict[str, Any]]:
        """The connected peers, one row each: ``peer``, ``path`` (``direct`` or ``relayed``), ``addr`` (the
        connection's remote address; a circuit address when relayed), ``relay`` (the relay's peer ID when
        relayed), ``rtt_ms`` (smoothed ping round trip in milliseconds, None until measured), ``conns``
        (:func:`node.net.paths.describe`). A peer's change of path is logged once at INFO."""
        try:
            lib = self.host.libp2p
        except RuntimeError:
            return []
        return [r.to_dict() for r in describe(lib, self.paths)]

    def path_of(self, peer: str) -> dict[str, Any]:
        """``{"path": "direct"|"relayed"|None, "rtt_ms": float|None}``: how ``peer`` is reached now (None: not
        connected) and its smoothed round trip, for a generation's route."""
        row = next((r for r in self.peers() if r["peer"] == peer), None)
        return {"path": row["path"] if row else None, "rtt_ms": self.paths.rtt_ms(peer)}

    async def _ping_loop(self) -> None:
        """Every :data:`PING_PERIOD` s: measure the round trip to up to :data:`MAX_PINGED` connected, verified
        peers (libp2p ping over the connection new streams use: the direct one when there is one), and record
        each path (an INFO line when a peer's path changes, e.g. after a hole punch)."""
        lib = self.host.libp2p
        while True:
            await trio.sleep(PING_PERIOD)
            rows = describe(lib, self.paths)
            peers = [r.peer for r in rows if self.hello.verified(r.peer)][:MAX_PINGED]
            async with trio.open_nursery() as n:
                for p in peers:
                    n.start_soon(self._ping_one, p)

    async def _ping_one(self, peer: str) -> None:
        """One ping; a peer that misses :data:`PING_FAILS` in a row has a dead connection that py-libp2p still
        counts as open (measured: a relayed circuit whose far end had gone kept every new stream waiting until
        its timeout, for minutes): close its connections, so the next stream redials it."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.id import ID

        rtt = await self.paths.measure(self.host.libp2p, ID.from_base58(peer))
        if rtt is not None or peer not in self.host.connected_peers():  # one gone meanwhile is forgotten here
            self._ping_fails.pop(peer, None)
            if rtt is not None and self.on_rtt is not None:
                self.on_rtt(peer, rtt / 1000.0)
            return
        n = self._ping_fails[peer] = self._ping_fails.get(peer, 0) + 1
        if n >= PING_FAILS:
            self._ping_fails.pop(peer, None)
            log.info("peer %s answered none of %d pings in %.0f s: closing its connections to redial it", peer, n,
                     n * PING_PERIOD)
            await self.host.disconnect(peer)

    def status(self) -> dict[str, Any]:
        """For ``/v1/status`` and logs: reachability, announced addresses, relay, peers known and connected, and
        each connected peer's path and round trip (:meth:`peers`)."""
        return {"reachability": self.reachability.value, "announced": self.host.addrs,
                "relay_reservation": self.relay.reserved_on if self.relay else None,
                "relaying": bool(self.relay and self.relay.hop),
                # circuits this node relayed since it started, by kind (members of this genesis, or others)
                "circuits": dict(self.relay.protocol.circuits) if self.relay and self.relay.hop
                else {"member": 0, "open": 0},
                "peers_known": len(self.book.peers), "peers_connected": len(self.host.connected_peers()),
                "refused_streams": self.host.limiter.refused_streams,
                "refused_connections": self.host.limiter.refused_conns,
                "closed_without_hello": self.host.conn_notifee.closed_without_hello if self.host.conn_notifee else 0,
                **self.host.admission.stats(), "peers": self.peers()}

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled (inside ``host.running()``)."""
        lib = self.host.libp2p
        # AUTO: every node that listens beyond loopback relays, within RELAY_LIMITS; a relay behind a NAT is
        # simply never chosen (nobody can reach it to reserve)
        hop = self.relay_mode is RelayMode.ON or (
            self.relay_mode is RelayMode.AUTO and not all(scope(a) is Scope.LOOPBACK
                                                          for a in self.host.bound_addrs()))
        loopback_only = all(scope(a) is Scope.LOOPBACK for a in self.host.bound_addrs())
        # a node bound to loopback alone needs no relay and no hole punching: every peer is on this machine
        self.relay = None if loopback_only else Relay(lib, hop=bool(hop), dcutr=self.dcutr,
                                                      member=lambda p: self.hello.wait_verified(p, MEMBER_WAIT),
                                                      private=self.announces_circuit)
        try:
            async with trio.open_nursery() as n:
                if self.relay is not None:
                    await n.start(self.relay.run)
                n.start_soon(self._manage)
                n.start_soon(self._reachability_loop)
                n.start_soon(self._relay_watch)
                n.start_soon(self._ping_loop)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._save()
