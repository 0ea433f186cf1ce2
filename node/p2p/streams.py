"""The request/response half of :class:`node.p2p.host.P2PHost`: serving a protocol (:meth:`StreamMethods.set_handler`,
one request per stream with :meth:`~StreamMethods.set_request_handler`) and asking a peer
(:meth:`~StreamMethods.open_stream`, :meth:`~StreamMethods.request`), with the framing, limits and penalties of
:mod:`node.p2p.framing`, :mod:`node.p2p.wirelimits` and :mod:`node.p2p.scoring`.

The host class mixes :class:`StreamMethods` in, as it does :class:`node.p2p.gossip.GossipMethods`; the attributes
and methods declared below are the host's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import trio

from .framing import (
    FrameError,
    ReadBusy,
    RemoteError,
    RequestTimeout,
    StreamClosed,
    check_reply,
    error_reply,
    read_msg,
    write_msg,
)
from .scoring import MALFORMED_FRAME, PeerScores
from .wirelimits import limit_for

if TYPE_CHECKING:
    from libp2p.abc import IHost, INetStream
    from libp2p.custom_types import TProtocol

log = logging.getLogger("node.p2p.host")  # the host's logger: its lines keep their name

# async def handler(stream, remote_peer_id); the libp2p stream is closed (or reset) when it returns (or raises)
StreamHandler = Callable[["INetStream", str], Awaitable[None]]
# async def fn(request, remote_peer_id) -> reply: msgpack maps from and to the peer
RequestHandler = Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]]


class PeerUnreachable(Exception):
    """No stream could be opened to the peer: unknown address, dial failure, or protocol not supported."""


class StreamMethods:
    """The streams half of :class:`node.p2p.host.P2PHost` (module docstring), which sets the attributes below and
    defines the methods they call (:meth:`~node.p2p.host.P2PHost.penalize`, ``banned``, ``connected_peers``,
    ``_require``)."""

    scores: PeerScores
    gate: Callable[[str, str], Awaitable[bool]] | None
    open_gate: set[str]
    dial_hint: Callable[[str], Awaitable[bool | None]] | None
    _handlers: dict[TProtocol, Callable[[INetStream], Awaitable[None]]]
    _host: IHost | None

    def penalize(self, peer_id: str, weight: float, ban_s: float | None = None) -> bool:
        raise NotImplementedError  # the host's

    def banned(self, peer_id: str) -> bool:
        raise NotImplementedError  # the host's

    def connected_peers(self) -> list[str]:
        raise NotImplementedError  # the host's

    def _require(self) -> IHost:
        raise NotImplementedError  # the host's


    def set_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        """Serve ``protocol_id`` with ``async def handler(stream, remote_peer_id: str)``.

        The stream is closed when the handler returns. If it raises, the error is logged (framing errors and
        closed streams at debug level) and the stream is reset; the host keeps running. A
        :class:`~node.p2p.framing.FrameError` first earns the peer an error frame (code ``bad_frame``) and a
        penalty (:meth:`penalize`); a :class:`~node.p2p.framing.ReadBusy` (the node-wide pool for large reads
        is full) an error frame (code ``busy``) and no penalty. Streams from a banned peer are reset at once.
        Messages the handler reads with ``read_msg(stream)`` get the protocol's limits
        (:mod:`node.p2p.wirelimits`).
        """
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.custom_types import TProtocol

        async def wrapped(stream: INetStream) -> None:
            remote = stream.muxed_conn.peer_id.to_base58()
            if self.scores.banned(remote) or (self.gate is not None and protocol_id not in self.open_gate
                                              and not await self.gate(remote, protocol_id)):
                await _reset(stream)
                return
            try:
                await handler(stream, remote)
            except (FrameError, ReadBusy) as e:
                log.debug("%s handler, peer %s: bad frame or busy: %s", protocol_id, remote, e)
                if isinstance(e, ReadBusy):  # this node's large-read pool is full: no fault of the peer's
                    reply = error_reply(e.code, e.message)
                else:
                    self.penalize(remote, MALFORMED_FRAME)
                    reply = error_reply("bad_frame", str(e))
                with trio.move_on_after(1.0):
                    with suppress(StreamClosed, RequestTimeout, FrameError):
                        await write_msg(stream, reply)
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

    def set_request_handler(self, protocol_id: str, fn: RequestHandler, timeout: float | None = None,
                            max_message: int | None = None) -> None:
        """Serve one request per stream: ``reply = await fn(msg, remote_peer_id)``.

        ``fn`` returns a reply map (``"status": "ok"`` is added when absent). If ``fn`` raises
        :class:`RemoteError`, the reply is ``error_reply(e.code, e.message)``; any other exception is logged and
        answered with code ``"internal"``. A malformed request is answered with code ``"bad_request"``.

        Args:
            timeout: seconds allowed to read the request and to write the reply (``None``: the protocol's read
                timeout in :data:`node.p2p.wirelimits.TABLE`, 10 s for a protocol not in it).
            max_message: largest request read, in bytes (``None``: the protocol's request limit in the table,
                64 KiB for a protocol not in it). Replies are written up to ``encoding.MAX_MESSAGE``.
        """
        lim = limit_for(protocol_id)
        timeout = lim.timeout if timeout is None else timeout
        max_message = lim.request if max_message is None else max_message

        async def handler(stream: INetStream, remote: str) -> None:
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

    async def open_stream(self, peer_id: str, protocol_id: str, timeout: float = 10.0) -> INetStream:
        """Open a new stream to ``peer_id`` speaking ``protocol_id`` (dials known addresses if needed).

        The caller owns the stream: use :func:`~node.p2p.framing.write_msg` / ``read_msg`` on it and finish with
        ``await stream.close()`` (or ``reset()``).

        Raises:
            PeerUnreachable: bad peer ID, a banned peer (never dialled), no address, dial failure, protocol not
                supported, or ``timeout`` seconds elapsed.
        """
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.custom_types import TProtocol
        from libp2p.peer.id import ID

        host = self._require()
        try:
            pid = ID.from_base58(peer_id)
        except Exception:  # noqa: BLE001 - ID.from_base58 raises several types
            raise PeerUnreachable(f"not a peer ID: {peer_id!r}") from None
        if self.banned(peer_id):
            raise PeerUnreachable(f"{peer_id} is banned (node.p2p.scoring)")
        try:
            with trio.fail_after(timeout):
                # Tally dials (reachable addresses raced, relays included: node.net.dial); py-libp2p would try
                # every stored address, unreachable ones too, each until its timeout
                if (self.dial_hint is not None and peer_id not in self.connected_peers()
                        and await self.dial_hint(peer_id) is False):
                    raise PeerUnreachable(f"{peer_id}: no address reachable from here answered")
                return await host.new_stream(pid, [TProtocol(protocol_id)])
        except trio.TooSlowError:
            raise PeerUnreachable(f"no stream to {peer_id} for {protocol_id} within {timeout} s") from None
        except PeerUnreachable:
            raise
        except Exception as e:  # noqa: BLE001 - every libp2p failure becomes PeerUnreachable
            raise PeerUnreachable(f"{peer_id} {protocol_id}: {type(e).__name__}: {e}") from None

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int | None = None) -> dict[str, Any]:
        """Open a stream, send ``msg``, read one reply, close. ``timeout`` (seconds) bounds the whole exchange.
        ``max_message``: largest reply read, in bytes (``None``: the protocol's reply limit in
        :data:`node.p2p.wirelimits.TABLE`, 64 KiB for a protocol not in it); ``msg`` is written up to
        ``encoding.MAX_MESSAGE``.

        Returns:
            The ``"status": "ok"`` reply map.

        Raises:
            PeerUnreachable: the stream could not be opened.
            RemoteError: the reply has ``"status": "error"`` (``.code``); :class:`~node.p2p.framing.ReadBusy`
                when this node's pool for large reads has no room for the reply.
            StreamClosed: the peer closed or reset the stream before a complete reply.
            FrameError: the reply broke framing or has no valid status.
            RequestTimeout: ``timeout`` elapsed.
        """
        stream = None
        try:
            with trio.fail_after(timeout):
                stream = await self.open_stream(peer_id, protocol_id, timeout=math.inf)
                await write_msg(stream, msg)
                reply = await read_msg(stream, timeout, limit_for(protocol_id).reply if max_message is None
                                       else max_message)
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


async def _reset(stream: INetStream) -> None:
    # best-effort cleanup of a stream that may already be gone
    with trio.CancelScope(shield=True), trio.move_on_after(1.0), suppress(Exception):
        await stream.reset()


async def _close(stream: INetStream) -> None:
    with trio.move_on_after(1.0):
        with suppress(Exception):  # best-effort cleanup of a stream that may already be gone
            await stream.close()
