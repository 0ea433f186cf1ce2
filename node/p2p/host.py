"""The node's libp2p host: TCP + Noise + Yamux, request/response streams and gossipsub (DESIGN.md, "Runtime").

Usage (everything runs inside the caller's trio loop)::

    host = P2PHost(identity, listen_port=0, chain_id="tally-devnet")
    host.set_handler("/tally/ping/1.0.0", handler)          # before or after start
    async with host.running():                                # starts; stops on exit
        await host.connect(["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooW..."])
        await host.subscribe(host.topic("tx"), on_tx)
        reply = await host.request(peer_id, "/tally/ping/1.0.0", {"x": 1}, timeout=5.0)

Peer IDs are strings (``12D3KooW...``); the peer ID of a node equals ``identity.peer_id`` (its ledger account).

Gossip semantics (de-duplication by content id, own messages delivered locally exactly once, gossipsub
settings) are described in :mod:`node.p2p.gossip`.

Hostile peers: a stream handler that fails with :class:`~node.p2p.framing.FrameError` (oversized or malformed
frame, undecodable msgpack, not a map) gets the peer an error frame (code ``bad_frame``) and a lower score
(:mod:`node.p2p.scoring`); applications report other offences with :meth:`P2PHost.penalize`. A peer whose
score crosses the threshold is disconnected and its streams are refused for a while. The node keeps serving
everyone else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import multiaddr
import nacl.signing
import trio

from .addrs import Scope, announceable, parse_addr, scope
from .admission import Admission, AdmissionLimits, install as install_admission
from .dialing import DialMethods, swarm_of
from .gossip import Gossip, GossipMethods, count_pubsub_traffic
from .gossipsub import cache_signed_records, make_router, raise_outbound_queue, retry_pubsub_streams
from .limits import ConnectionNotifee, Limits, PeerLimiter, StreamGate
from .logs import install as route_network_logs
from .peerstore import bounded_peerstore
from .quirks import batch_yamux_window_updates, check_port_free, exception_leaves
from .scoring import PeerScores
from .streams import (
    PeerUnreachable as PeerUnreachable,  # re-exported: callers import it from the host module
    StreamMethods,
)

if TYPE_CHECKING:
    from libp2p.abc import IHost, INotifee
    from libp2p.crypto.keys import KeyPair
    from libp2p.peer.id import ID
    from libp2p.pubsub.gossipsub import GossipSub
    from libp2p.pubsub.pubsub import Pubsub

    from ..keys import Identity

log = logging.getLogger(__name__)

VOUCH_TTL = 3600.0  # seconds a peer whose receipt landed keeps reserved slots (P2PHost.vouch)
ANNOUNCED_TTL = 10.0  # seconds an :meth:`P2PHost.announced` result is reused (interface IPs behind a wildcard)


def libp2p_keypair(identity: Identity) -> KeyPair:
    """The libp2p ``KeyPair`` of a node's :class:`node.identity.Identity`, so that peer ID and account are one
    Ed25519 key. (py-libp2p is imported where the host starts, as in :meth:`P2PHost.running`.)"""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.crypto.ed25519 import Ed25519PrivateKey
    from libp2p.crypto.keys import KeyPair

    priv = Ed25519PrivateKey(nacl.signing.SigningKey(identity.seed))
    return KeyPair(priv, priv.get_public_key())


class P2PHost(GossipMethods, StreamMethods, DialMethods):
    """One node's libp2p host.

    Args:
        identity: :class:`node.identity.Identity`; its Ed25519 key is the libp2p key (peer ID == account).
        listen_port: TCP port, 0 for any free port.
        chain_id: chain id used in topic names (required, non-empty).
        listen_host: IP address to listen on (``"0.0.0.0"`` for all interfaces) with ``listen_port``, when
            ``listen`` is not given.
        listen: multiaddrs to bind, e.g. ``["/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001"]``
            (:func:`node.p2p.addrs.parse_addr`).
        announce: multiaddrs reachable from outside (port forwarding, a DNS name), announced first.
        genesis_hash: the chain's genesis hash; gossip topics carry its first 8 bytes, so nodes of another
            genesis never share a topic (the connection-time check is :mod:`node.net.hello`).
        limits: per-peer connection and stream limits (:class:`node.p2p.limits.Limits`).
        admission: limits on raw inbound connections per IP and subnet, before any handshake
            (:class:`node.p2p.admission.AdmissionLimits`).
        heartbeat_interval: gossipsub heartbeat in seconds (mesh maintenance, gossip).
        degree, degree_low, degree_high: gossipsub mesh degree D, D_lo, D_hi.
        scores: per-peer misbehaviour scores (default: :class:`~node.p2p.scoring.PeerScores` defaults).

    Raises:
        ValueError: empty ``chain_id``.
        node.p2p.addrs.AddrError: a bad ``listen`` or ``announce`` multiaddr.
    """

    def __init__(self, identity: Identity, listen_port: int = 0, chain_id: str | None = None, *,
                 listen_host: str = "127.0.0.1", heartbeat_interval: float = 0.5,
                 degree: int = 6, degree_low: int = 4, degree_high: int = 12, scores: PeerScores | None = None,
                 listen: list[str] | None = None, announce: list[str] | None = None,
                 genesis_hash: bytes | None = None, limits: Limits | None = None,
                 admission: AdmissionLimits | None = None):
        if not chain_id:
            raise ValueError("chain_id is required")
        self.identity = identity
        self.chain_id = chain_id
        self.genesis_hash = genesis_hash
        self.listen_port = listen_port
        self.listen_host = listen_host
        ip = "ip6" if ":" in listen_host else "ip4"
        self.listen = [parse_addr(a, for_listen=True) for a in listen] if listen else \
            [f"/{ip}/{listen_host}/tcp/{listen_port}"]
        self.announce = [parse_addr(a, for_listen=False) for a in announce or []]
        self.confirmed_addrs: list[str] = []  # reached by a peer's dial-back (node.net.reachability)
        self.relay_addrs: list[str] = []  # .../p2p/<relay>/p2p-circuit while holding a reservation
        self.limiter = PeerLimiter(limits)
        self.admission = Admission(admission)
        self.limiter.vouched = self.admission.peer_reserved
        # set by node.net.service: whether a peer completed the genesis handshake; a connection whose peer has
        # not within Limits.hello_timeout seconds is closed (None: no handshake runs, nothing is closed)
        self.is_member: Callable[[str], bool] | None = None
        self.conn_notifee: ConnectionNotifee | None = None  # while running: connection limits, hello deadline
        self.gate: Callable[[str, str], Awaitable[bool]] | None = None  # (peer, protocol) -> serve it?
        self.open_gate: set[str] = set()  # protocols served before the gate (the handshake itself)
        self.on_connected: list[Callable[[str, Any], None]] = []
        self.on_disconnected: list[Callable[[str, Any], None]] = []
        self.circuit_dialer: Callable[[str], Awaitable[bool]] | None = None
        # connect a peer before a stream (node.net.service: the address book, happy eyeballs): True connected,
        # False every address failed (the stream is not tried), None no address known (py-libp2p dials)
        self.dial_hint: Callable[[str], Awaitable[bool | None]] | None = None
        # of "/.../p2p/<id>" addresses, those worth putting in the peerstore (None: all)
        # (peer, its addresses without /p2p/<peer>) -> connected? : how connect() dials one peer (node.net.service:
        # reachable addresses only, raced, first success cancels the rest); None: every address in parallel
        self.peer_dialer: Callable[[str, list[str]], Awaitable[bool]] | None = None
        self.dial_filter: Callable[[list[str]], list[str]] | None = None
        self._gossip_params: dict[str, Any] = dict(degree=degree, degree_low=degree_low, degree_high=degree_high,
                                   heartbeat_interval=heartbeat_interval)
        self._handlers = {}
        self._host: IHost | None = None
        self._gossip: Gossip | None = None
        self._peer_id: str = identity.peer_id
        self.scores = scores if scores is not None else PeerScores()
        self._nursery: trio.Nursery | None = None
        # py-libp2p asks for the host's addresses on every pubsub RPC it sends (its signed peer record) and
        # presence gossip repeats every peer's addresses twice a second: pure-Python multiaddr parsing of the
        # same strings was a quarter of a busy test process's CPU (profiled), so results are cached
        self._bound: list[str] | None = None
        # (inputs: announce, confirmed and relay addresses; when; result)
        self._announced: tuple[tuple[tuple[str, ...], ...], float, list[str]] | None = None
        self._factory: tuple[tuple[str, ...], list[multiaddr.Multiaddr]] = ((), [])
        # "/.../p2p/<id>" -> (ID, its string, [multiaddr])
        self._parsed: dict[str, tuple[ID, str, list[multiaddr.Multiaddr]]] = {}

    # ------------------------------------------------------------------ lifecycle

    @asynccontextmanager
    async def running(self) -> AsyncIterator[P2PHost]:
        """Start the host, listen, run pubsub + gossipsub; yield ``self``; stop everything on exit.

        Stopping cancels gossip reader/worker tasks, closes all connections and the listening socket (~0.1 s per
        host). Handlers registered with :meth:`set_handler` before start are installed at start. An exception
        raised in the body propagates as itself, not wrapped in an ExceptionGroup (when it is the only one).

        Raises:
            OSError: the port is in use or cannot be bound.
            RuntimeError: already running.
        """
        if self._host is not None:
            raise RuntimeError("host already running")
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p import new_host
        from libp2p.crypto.x25519 import create_new_key_pair as x25519_pair
        from libp2p.custom_types import TProtocol
        from libp2p.pubsub.pubsub import Pubsub
        from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID, Transport as NoiseTransport
        from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID, Yamux

        route_network_logs()  # py-libp2p's records through Tally's logging; normal NAT behaviour is no ERROR
        raise_outbound_queue()
        retry_pubsub_streams()
        count_pubsub_traffic()
        cache_signed_records()
        batch_yamux_window_updates()
        for a in self.listen:
            parts = a.split("/")
            if parts[4] != "0":
                check_port_free(parts[2], int(parts[4]))
        kp = libp2p_keypair(self.identity)
        listen = [multiaddr.Multiaddr(a) for a in self.listen]
        peerstore = bounded_peerstore(keep=lambda pid: bool(host.get_network().get_connections(pid)))
        host = new_host(
            key_pair=kp,
            sec_opt={NOISE_ID: NoiseTransport(kp, noise_privkey=x25519_pair().private_key)},
            muxer_opt={TProtocol(YAMUX_ID): Yamux},
            listen_addrs=listen,
            addrs_factory=lambda _candidates: self._factory_addrs(multiaddr.Multiaddr),
            peerstore_opt=peerstore,  # bounded, never evicting its own key or a connected peer (node.p2p.peerstore)
        )
        self._memoize_get_addrs(host)
        # py-libp2p's resource manager caps streams node-wide and leaks slots on refusals (node.p2p.limits):
        # Tally's per-peer limits replace it
        swarm_of(host).set_resource_manager(None)
        # py-libp2p's accept path holds an inbound slot per connection until the swarm stops, and caps nothing
        # per address: Tally's admission replaces it (node.p2p.admission)
        install_admission(host.get_network(), self.admission)
        StreamGate(self.limiter, self).install(host.get_network())
        gossipsub = make_router(**self._gossip_params)
        pubsub = Pubsub(host, gossipsub)
        # py-libp2p numbers publications from int(time.time()) + 1, one per message: a validator publishes several a
        # second, so after a restart its numbers repeat ones its peers saw in the last seen_ttl (120 s) and every
        # message it publishes (transactions, votes, blocks) is dropped as a duplicate until the count catches up
        # (issue 28). Nanoseconds, as go-libp2p does: a restart always starts above anything published before.
        pubsub.counter = time.time_ns()
        for proto, fn in self._handlers.items():
            host.set_stream_handler(TProtocol(proto), fn)
        body_done = False
        try:
            async with self._serve(host, pubsub, gossipsub, listen):
                yield self
                body_done = True
        except BaseExceptionGroup as eg:  # the nurseries in _serve wrap everything; unwrap a lone error
            leaves = exception_leaves(eg)
            if body_done and all(_late_spawn(e) for e in leaves):
                # py-libp2p's pubsub may try to start a reader task for a stream that arrives while the host is
                # shutting down; that is no failure of the body, which has already finished
                log.debug("ignored %d late task spawn(s) during host shutdown", len(leaves))
                return
            if len(leaves) == 1:
                raise leaves[0] from None
            # py-libp2p's services nest more than ten task groups deep, past what a traceback prints: name them
            named = list(dict.fromkeys(f"{type(e).__name__}: {e}"[:200] for e in leaves
                                       if not isinstance(e, trio.Cancelled)))
            log.warning("host %s stopped with %d errors%s: %s", self._peer_id, len(leaves),
                        " after its body finished" if body_done else "", "; ".join(named[:5]) or "cancellations")
            raise
        finally:
            self._host = self._gossip = self._nursery = None
            self._bound = self._announced = None
            self._factory = ((), [])

    @asynccontextmanager
    async def _serve(self, host: IHost, pubsub: Pubsub, gossipsub: GossipSub,
                     listen: list[multiaddr.Multiaddr]) -> AsyncIterator[None]:
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.tools.anyio_service import background_trio_service

        async with host.run(listen):
            try:
                if len(host.get_transport_addrs()) < len(listen):  # py-libp2p logs a failed bind, carries on
                    raise OSError(f"could not listen on {', '.join(map(str, listen))} (port in use?)")
                async with background_trio_service(pubsub), background_trio_service(gossipsub):
                    await pubsub.wait_until_ready()
                    async with trio.open_nursery() as nursery:
                        self._host, self._gossip = host, Gossip(pubsub, nursery, self._peer_id)
                        self._nursery = nursery
                        self.conn_notifee = ConnectionNotifee(
                            self.limiter, self, nursery.start_soon, self._connected, self._disconnected,
                            may_stay=lambda: self.is_member)
                        # ConnectionNotifee has INotifee's methods without subclassing it (py-libp2p loads late)
                        host.get_network().register_notifee(cast("INotifee", self.conn_notifee))
                        log.info("p2p host %s listening on %s", self._peer_id, self.addrs)
                        try:
                            yield
                        finally:
                            nursery.cancel_scope.cancel()
            finally:
                # py-libp2p's own shutdown path awaits inside a cancelled scope and leaks the listening socket
                # and connections; close them explicitly, shielded and bounded.
                with trio.CancelScope(shield=True) as cs:
                    cs.deadline = trio.current_time() + 3.0
                    try:
                        await host.close()
                    except Exception as e:  # noqa: BLE001 - shutting down: py-libp2p's close may raise anything
                        log.debug("host close: %s: %s", type(e).__name__, e)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``await fn(*args)`` in the host's background nursery (cancelled when the host stops).

        Raises:
            RuntimeError: not running.
        """
        if self._nursery is None:
            raise RuntimeError("host is not running (use `async with host.running()`)")
        self._nursery.start_soon(fn, *args)

    async def start_service(self, fn: Callable[..., Awaitable[Any]]) -> Any:
        """``await nursery.start(fn)`` in the host's background nursery: returns when ``fn`` reports started."""
        if self._nursery is None:
            raise RuntimeError("host is not running (use `async with host.running()`)")
        return await self._nursery.start(fn)

    def _connected(self, peer: str, conn: Any) -> None:
        for f in self.on_connected:
            f(peer, conn)

    def _disconnected(self, peer: str, conn: Any) -> None:
        for f in self.on_disconnected:
            f(peer, conn)

    @property
    def libp2p(self) -> IHost:
        """The running py-libp2p ``IHost`` (for :mod:`node.net`)."""
        return self._require()

    def _require(self) -> IHost:
        if self._host is None:
            raise RuntimeError("host is not running (use `async with host.running()`)")
        return self._host

    # ------------------------------------------------------------------ identity, peers

    @property
    def peer_id(self) -> str:
        """This node's peer ID string (== ``identity.peer_id``)."""
        return self._peer_id

    @property
    def addrs(self) -> list[str]:
        """Announced multiaddrs with ``/p2p/<peer id>``, best first (:meth:`announced`), e.g.
        ``/ip4/10.0.0.2/tcp/4001/p2p/12D3KooW...``; a relayed node's circuit address ends in
        ``/p2p/<relay>/p2p-circuit/p2p/<peer id>``."""
        self._require()
        return [f"{a}/p2p/{self._peer_id}" for a in self.announced()]

    def bound_addrs(self) -> list[str]:
        """The multiaddrs the transport listens on, with their real ports (wildcards stay wildcards); read
        once the listeners are up (they do not change while the host runs)."""
        host = self._require()
        if self._bound is None:
            bound = [str(a) for a in host.get_transport_addrs()]
            if len(bound) < len(self.listen):  # not all listening yet: ask again next time
                return bound
            self._bound = bound
        return list(self._bound)

    def announced(self) -> list[str]:
        """What this node tells others it can be reached at, without ``/p2p``: ``--announce`` addresses,
        dial-back-confirmed and relay addresses, then bound addresses with wildcards expanded; never wildcard,
        loopback only for a node bound to loopback alone (:func:`node.p2p.addrs.announceable`)."""
        if self._host is None:
            return []
        key = (tuple(self.announce), tuple(self.confirmed_addrs), tuple(self.relay_addrs))
        now = time.monotonic()
        cached = self._announced
        if cached is not None and cached[0] == key and now - cached[1] < ANNOUNCED_TTL:
            return list(cached[2])
        out = announceable(self.announce, self.bound_addrs(), self.confirmed_addrs, self.relay_addrs)
        if self._bound is not None:
            self._announced = (key, now, out)
        return list(out)

    def _memoize_get_addrs(self, host: IHost) -> None:
        """py-libp2p calls ``get_addrs()`` (transport addresses, observed ones, the factory, ``/p2p`` suffixes:
        ~2 ms of multiaddr parsing) for every pubsub RPC it sends; with our factory its result depends on
        :meth:`announced` alone, so it is recomputed only when that changes."""
        inner = host.get_addrs
        memo: tuple[tuple[str, ...] | None, list[multiaddr.Multiaddr]] = (None, [])

        def get_addrs() -> list[multiaddr.Multiaddr]:
            nonlocal memo
            key = tuple(self.announced())
            if memo[0] != key:
                memo = (key, inner())
            return list(memo[1])

        host.get_addrs = get_addrs  # type: ignore[method-assign]  # py-libp2p's, memoized on this instance

    def _factory_addrs(self, make: Callable[[str], multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        """py-libp2p's ``addrs_factory``: :meth:`announced` but circuit addresses, as multiaddr objects made
        with ``make`` (kept while the announced strings stay the same)."""
        strs = tuple(a for a in self.announced() if scope(a) is not Scope.RELAY)
        if strs != self._factory[0]:
            self._factory = (strs, [make(a) for a in strs])
        return list(self._factory[1])

    def reserve(self, peers: Iterable[str] = (), ips: Iterable[str] = ()) -> None:
        """Keep connection slots for ``peers`` (peer ID strings: validators, bootstrap peers) and for connections
        from ``ips`` (their addresses): reserved peers are not held to ``Limits.max_conns`` and reserved IPs get
        the admission's reserved slots (:mod:`node.p2p.admission`); once a reserved peer has connected, its IP
        is reserved too. Callable before or while running."""
        for p in peers:
            self.limiter.reserved.add(p)
            self.admission.reserved_peers.add(p)
        for ip in ips:
            self.admission.reserve_ip(ip)

    def vouch(self, peers: Iterable[str], ttl: float = VOUCH_TTL) -> None:
        """Keep connection slots for ``peers`` (peer ID strings that recently did useful work: a receipt of
        theirs landed in a block) for ``ttl`` seconds from now, as :meth:`reserve` does for validators; each
        vouch ends by itself (nothing a peer caused outlives its cause) and the table is LRU-bounded
        (:meth:`node.p2p.admission.Admission.vouch`)."""
        until = self.admission.clock() + ttl
        for p in peers:
            self.admission.vouch(p, until)

    def banned(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is banned now (its streams and connections are refused)."""
        return self.scores.banned(peer_id)

    def connected_peers(self) -> list[str]:
        """Peer IDs with at least one open connection."""
        if self._host is None:
            return []
        return [p.to_base58() for p in self._host.get_connected_peers()]

    # ------------------------------------------------------------------ misbehaviour

    def penalize(self, peer_id: str, weight: float, ban_s: float | None = None) -> bool:
        """Lower ``peer_id``'s score by ``weight`` points (:mod:`node.p2p.scoring`); when it crosses the
        threshold, disconnect it in the background (its new streams and connections are refused while banned,
        ``ban_s`` seconds or the scorer's default).

        Returns:
            True when the peer is being disconnected.
        """
        if not self.scores.penalize(peer_id, weight, ban_s):
            return False
        log.info("peer %s misbehaved repeatedly: disconnecting", peer_id)
        if self._nursery is not None:
            self._nursery.start_soon(self.disconnect, peer_id)
        return True

    async def disconnect(self, peer_id: str, timeout: float = 3.0) -> None:
        """Close every connection to ``peer_id`` (no error if there is none)."""
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.id import ID

        if self._host is None:
            return
        with trio.move_on_after(timeout):
            try:
                await self._host.disconnect(ID.from_base58(peer_id))
            except Exception as e:  # noqa: BLE001 - best effort: the peer may already be gone
                log.debug("disconnect %s: %s: %s", peer_id, type(e).__name__, e)


def _late_spawn(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "closed to new arrivals" in str(e)
