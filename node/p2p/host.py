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
import math
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import trio

from ..encoding import MAX_MESSAGE
from .framing import (FrameError, RemoteError, RequestTimeout, StreamClosed, check_reply, error_reply,
                      read_msg, write_msg)
from .gossip import TOPIC_NAMES, Gossip, GossipHandler, make_router, raise_outbound_queue
from .quirks import batch_yamux_window_updates, check_port_free, exception_leaves, route_libp2p_logging
from .scoring import MALFORMED_FRAME, PeerScores

log = logging.getLogger(__name__)

StreamHandler = Callable[[Any, str], Awaitable[None]]
RequestHandler = Callable[[dict, str], Awaitable[dict]]


class PeerUnreachable(Exception):
    """No stream could be opened to the peer: unknown address, dial failure, or protocol not supported."""


class P2PHost:
    """One node's libp2p host.

    Args:
        identity: :class:`node.identity.Identity`; its Ed25519 key is the libp2p key (peer ID == account).
        listen_port: TCP port, 0 for any free port.
        chain_id: chain id used in topic names (required, non-empty).
        listen_host: IPv4 address to listen on (``"0.0.0.0"`` for all interfaces).
        heartbeat_interval: gossipsub heartbeat in seconds (mesh maintenance, gossip).
        degree, degree_low, degree_high: gossipsub mesh degree D, D_lo, D_hi.
        scores: per-peer misbehaviour scores (default: :class:`~node.p2p.scoring.PeerScores` defaults).

    Raises:
        ValueError: empty ``chain_id``.
    """

    def __init__(self, identity, listen_port: int = 0, chain_id: str | None = None, *,
                 listen_host: str = "127.0.0.1", heartbeat_interval: float = 0.5,
                 degree: int = 6, degree_low: int = 4, degree_high: int = 12, scores: PeerScores | None = None):
        if not chain_id:
            raise ValueError("chain_id is required")
        self.identity = identity
        self.chain_id = chain_id
        self.listen_port = listen_port
        self.listen_host = listen_host
        self._gossip_params = dict(degree=degree, degree_low=degree_low, degree_high=degree_high,
                                   heartbeat_interval=heartbeat_interval)
        self._handlers: dict[str, Any] = {}
        self._host = None
        self._gossip: Gossip | None = None
        self._peer_id: str = identity.peer_id
        self.scores = scores if scores is not None else PeerScores()
        self._nursery = None

    # ------------------------------------------------------------------ lifecycle

    @asynccontextmanager
    async def running(self) -> AsyncIterator["P2PHost"]:
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
        import multiaddr
        from libp2p import new_host
        from libp2p.crypto.x25519 import create_new_key_pair as x25519_pair
        from libp2p.pubsub.pubsub import Pubsub
        from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
        from libp2p.security.noise.transport import Transport as NoiseTransport
        from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
        from libp2p.stream_muxer.yamux.yamux import Yamux

        route_libp2p_logging()
        raise_outbound_queue()
        batch_yamux_window_updates()
        if self.listen_port:
            check_port_free(self.listen_host, self.listen_port)
        kp = self.identity.libp2p_keypair()
        listen = multiaddr.Multiaddr(f"/ip4/{self.listen_host}/tcp/{self.listen_port}")
        host = new_host(
            key_pair=kp,
            sec_opt={NOISE_ID: NoiseTransport(kp, noise_privkey=x25519_pair().private_key)},
            muxer_opt={YAMUX_ID: Yamux},
            listen_addrs=[listen],
        )
        gossipsub = make_router(**self._gossip_params)
        pubsub = Pubsub(host, gossipsub)
        for proto, fn in self._handlers.items():
            host.set_stream_handler(proto, fn)
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
            raise
        finally:
            self._host = self._gossip = self._nursery = None

    @asynccontextmanager
    async def _serve(self, host, pubsub, gossipsub, listen) -> AsyncIterator[None]:
        from libp2p.tools.anyio_service import background_trio_service

        async with host.run([listen]):
            try:
                if not host.get_transport_addrs():  # py-libp2p logs a failed bind and carries on
                    raise OSError(f"could not listen on {listen} (port in use?)")
                async with background_trio_service(pubsub), background_trio_service(gossipsub):
                    await pubsub.wait_until_ready()
                    async with trio.open_nursery() as nursery:
                        self._host, self._gossip = host, Gossip(pubsub, nursery, self._peer_id)
                        self._nursery = nursery
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
                    except Exception as e:
                        log.debug("host close: %s: %s", type(e).__name__, e)

    def _require(self):
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
        """Listen multiaddrs with ``/p2p/<peer id>``, e.g. ``/ip4/127.0.0.1/tcp/40123/p2p/12D3KooW...``."""
        return [str(a) for a in self._require().get_addrs()]

    def connected_peers(self) -> list[str]:
        """Peer IDs with at least one open connection."""
        if self._host is None:
            return []
        return [p.to_base58() for p in self._host.get_connected_peers()]

    async def connect(self, multiaddrs: list[str], timeout: float = 10.0) -> int:
        """Dial every ``/.../p2p/<id>`` address in parallel (each dial ~0.25 s); failures are logged.

        Addresses of this node itself are skipped. Peers already connected count as connected.

        Args:
            multiaddrs: full multiaddrs including ``/p2p/<peer id>``.
            timeout: seconds allowed per dial.

        Returns:
            The number of distinct peers connected among those addressed.
        """
        from libp2p.peer.peerinfo import info_from_p2p_addr
        import multiaddr

        host = self._require()
        ok: set[str] = set()

        async def dial(addr: str) -> None:
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
            except Exception as e:
                log.warning("bad peer address %r: %s", addr, e)
                return
            pid = info.peer_id.to_base58()
            if pid == self._peer_id:
                return
            try:
                with trio.fail_after(timeout):
                    await host.connect(info)
                ok.add(pid)
            except Exception as e:  # dial errors come in many libp2p types; none may stop the others
                log.warning("connect to %s failed: %s: %s", addr, type(e).__name__, e)

        async with trio.open_nursery() as n:
            for a in multiaddrs:
                n.start_soon(dial, a)
        return len(ok)

    def remember(self, multiaddrs: list[str], ttl: int = 120) -> int:
        """Put ``/.../p2p/<id>`` addresses in the peerstore for ``ttl`` seconds, so a later stream to that peer
        dials it on demand (peers learn each other's addresses from gossip, not only from bootstrap).
        Bad addresses and our own are ignored. Returns how many were stored."""
        from libp2p.peer.peerinfo import info_from_p2p_addr
        import multiaddr

        host = self._require()
        n = 0
        for addr in multiaddrs[:16]:
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
            except Exception:
                continue
            if info.peer_id.to_base58() != self._peer_id:
                host.get_peerstore().add_addrs(info.peer_id, info.addrs, ttl)
                n += 1
        return n

    # ------------------------------------------------------------------ misbehaviour

    def penalize(self, peer_id: str, weight: float) -> bool:
        """Lower ``peer_id``'s score by ``weight`` points (:mod:`node.p2p.scoring`); when it crosses the
        threshold, disconnect it in the background (its new streams are refused while banned).

        Returns:
            True when the peer is being disconnected.
        """
        if not self.scores.penalize(peer_id, weight):
            return False
        log.info("peer %s misbehaved repeatedly: disconnecting", peer_id)
        if self._nursery is not None:
            self._nursery.start_soon(self.disconnect, peer_id)
        return True

    async def disconnect(self, peer_id: str, timeout: float = 3.0) -> None:
        """Close every connection to ``peer_id`` (no error if there is none)."""
        from libp2p.peer.id import ID

        if self._host is None:
            return
        with trio.move_on_after(timeout):
            try:
                await self._host.disconnect(ID.from_base58(peer_id))
            except Exception as e:
                log.debug("disconnect %s: %s: %s", peer_id, type(e).__name__, e)

    # ------------------------------------------------------------------ streams

    def set_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        """Serve ``protocol_id`` with ``async def handler(stream, remote_peer_id: str)``.

        The stream is closed when the handler returns. If it raises, the error is logged (framing errors and
        closed streams at debug level) and the stream is reset; the host keeps running. A
        :class:`~node.p2p.framing.FrameError` first earns the peer an error frame (code ``bad_frame``) and a
        penalty (:meth:`penalize`). Streams from a banned peer are reset at once.
        """
        from libp2p.custom_types import TProtocol

        async def wrapped(stream) -> None:
            remote = stream.muxed_conn.peer_id.to_base58()
            if self.scores.banned(remote):
                await _reset(stream)
                return
            try:
                await handler(stream, remote)
            except FrameError as e:
                log.debug("%s handler, peer %s: bad frame: %s", protocol_id, remote, e)
                self.penalize(remote, MALFORMED_FRAME)
                with trio.move_on_after(1.0):
                    try:
                        await write_msg(stream, error_reply("bad_frame", str(e)))
                    except (StreamClosed, RequestTimeout, FrameError):
                        pass
                await _reset(stream)
            except (StreamClosed, RequestTimeout) as e:
                log.debug("%s handler, peer %s: %s: %s", protocol_id, remote, type(e).__name__, e)
                await _reset(stream)
            except Exception:
                log.exception("%s handler failed for peer %s", protocol_id, remote)
                await _reset(stream)
            else:
                await _close(stream)

        self._handlers[TProtocol(protocol_id)] = wrapped
        if self._host is not None:
            self._host.set_stream_handler(TProtocol(protocol_id), wrapped)

    def set_request_handler(self, protocol_id: str, fn: RequestHandler, timeout: float = 30.0,
                            max_message: int = MAX_MESSAGE) -> None:
        """Serve one request per stream: ``reply = await fn(msg, remote_peer_id)``.

        ``fn`` returns a reply map (``"status": "ok"`` is added when absent). If ``fn`` raises
        :class:`RemoteError`, the reply is ``error_reply(e.code, e.message)``; any other exception is logged and
        answered with code ``"internal"``. A malformed request is answered with code ``"bad_request"``.

        Args:
            timeout: seconds allowed to read the request and to write the reply.
        """

        async def handler(stream, remote: str) -> None:
            try:
                msg = await read_msg(stream, timeout, max_message)
            except FrameError as e:
                self.penalize(remote, MALFORMED_FRAME)
                await write_msg(stream, error_reply("bad_request", str(e)), timeout=timeout)
                return
            try:
                reply = await fn(msg, remote)
                if not isinstance(reply, dict):
                    raise TypeError(f"request handler returned {type(reply).__name__}, expected dict")
                reply.setdefault("status", "ok")
            except RemoteError as e:
                reply = error_reply(e.code, e.message)
            except Exception as e:
                log.exception("%s request from %s failed", protocol_id, remote)
                reply = error_reply("internal", f"{type(e).__name__}: {e}")
            await write_msg(stream, reply, timeout=timeout)

        self.set_handler(protocol_id, handler)

    async def open_stream(self, peer_id: str, protocol_id: str, timeout: float = 10.0):
        """Open a new stream to ``peer_id`` speaking ``protocol_id`` (dials known addresses if needed).

        The caller owns the stream: use :func:`~node.p2p.framing.write_msg` / ``read_msg`` on it and finish with
        ``await stream.close()`` (or ``reset()``).

        Raises:
            PeerUnreachable: bad peer ID, no address, dial failure, protocol not supported, or ``timeout``
                seconds elapsed.
        """
        from libp2p.custom_types import TProtocol
        from libp2p.peer.id import ID

        host = self._require()
        try:
            pid = ID.from_base58(peer_id)
        except Exception:
            raise PeerUnreachable(f"not a peer ID: {peer_id!r}") from None
        try:
            with trio.fail_after(timeout):
                return await host.new_stream(pid, [TProtocol(protocol_id)])
        except trio.TooSlowError:
            raise PeerUnreachable(f"no stream to {peer_id} for {protocol_id} within {timeout} s") from None
        except Exception as e:
            raise PeerUnreachable(f"{peer_id} {protocol_id}: {type(e).__name__}: {e}") from None

    async def request(self, peer_id: str, protocol_id: str, msg: dict, timeout: float,
                      max_message: int = MAX_MESSAGE) -> dict:
        """Open a stream, send ``msg``, read one reply, close. ``timeout`` (seconds) bounds the whole exchange.

        Returns:
            The ``"status": "ok"`` reply map.

        Raises:
            PeerUnreachable: the stream could not be opened.
            RemoteError: the reply has ``"status": "error"`` (``.code``).
            StreamClosed: the peer closed or reset the stream before a complete reply.
            FrameError: the reply broke framing or has no valid status.
            RequestTimeout: ``timeout`` elapsed.
        """
        stream = None
        try:
            with trio.fail_after(timeout):
                stream = await self.open_stream(peer_id, protocol_id, timeout=math.inf)
                await write_msg(stream, msg, max_message=max_message)
                reply = await read_msg(stream, timeout, max_message)
        except trio.TooSlowError:
            if stream is not None:
                await _reset(stream)
            raise RequestTimeout(f"{protocol_id} to {peer_id}: no reply within {timeout} s") from None
        except BaseException:
            if stream is not None:
                await _reset(stream)
            raise
        await _close(stream)
        return check_reply(reply)

    # ------------------------------------------------------------------ gossip

    def topic(self, name: str) -> str:
        """Full topic name ``tally/<chain_id>/<name>`` (``name`` in ``tx``, ``consensus``, ``shards``).

        Raises:
            ValueError: unknown name.
        """
        if name not in TOPIC_NAMES:
            raise ValueError(f"unknown topic {name!r}; expected one of {TOPIC_NAMES}")
        return f"tally/{self.chain_id}/{name}"

    async def subscribe(self, topic: str, handler: GossipHandler) -> None:
        """Subscribe to ``topic``: ``await handler(data: bytes, from_peer: str)`` runs once per distinct content,
        in arrival order, own publications included (:mod:`node.p2p.gossip`). Handler errors are logged.

        Raises:
            RuntimeError: not running, or already subscribed to ``topic``.
        """
        self._require()
        await self._gossip.subscribe(topic, handler)

    async def publish(self, topic: str, data: bytes) -> None:
        """Sign and publish ``data`` (at most ``gossip.MAX_GOSSIP`` = 512 KiB) on ``topic``.

        Peers learn of subscriptions asynchronously; a message published before any neighbour is known to be
        subscribed is queued by py-libp2p for peers still being identified, but may reach no one (see
        :meth:`wait_for_topic_peers`).

        Raises:
            RuntimeError: not running.
            TypeError: ``data`` is not bytes.
            ValueError: ``data`` is too large.
        """
        self._require()
        await self._gossip.publish(topic, data)

    def topic_peers(self, topic: str) -> list[str]:
        """Connected peers known to be subscribed to ``topic`` ([] when not running)."""
        return self._gossip.topic_peers(topic) if self._gossip else []

    def mesh_peers(self, topic: str) -> list[str]:
        """Peers in this node's gossipsub mesh for ``topic`` ([] when not running)."""
        return self._gossip.mesh_peers(topic) if self._gossip else []

    async def wait_for_topic_peers(self, topic: str, n: int = 1, timeout: float = 5.0, mesh: bool = True) -> None:
        """Wait until at least ``n`` peers are in the mesh for ``topic`` (``mesh=False``: known subscribed).

        Raises:
            RuntimeError: not running.
            RequestTimeout: not reached within ``timeout`` seconds.
        """
        self._require()
        await self._gossip.wait_for_topic_peers(topic, n, timeout, mesh)


def _late_spawn(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "closed to new arrivals" in str(e)


async def _reset(stream) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
        try:
            await stream.reset()
        except Exception:
            pass


async def _close(stream) -> None:
    with trio.move_on_after(1.0):
        try:
            await stream.close()
        except Exception:
            pass
