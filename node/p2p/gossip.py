"""Gossipsub for Tally: py-libp2p's Pubsub + GossipSub, tuned, plus content de-duplication (DESIGN.md, "Runtime").

Used through :class:`node.p2p.host.P2PHost` (``subscribe`` / ``publish`` / ``topic``); this module holds the
mechanics.

Semantics:

* One reader task per subscribed topic pulls from py-libp2p's subscription (a 32-slot queue that silently drops
  when full) into a local queue of ``GOSSIP_QUEUE`` messages; one worker task per topic calls the handler in
  arrival order. A slow handler delays later messages of its own topic only; when the local queue is full, new
  messages are dropped with a warning.
* Deliveries are de-duplicated per topic by content id ``H(data)`` in an LRU of ``DEDUP_SIZE`` ids, whatever
  the pubsub cache does: identical bytes (from anyone) reach the handler once while their id is in the LRU.
* A node's own publications reach its own handler exactly once: :meth:`Gossip.publish` queues them for the local
  handler directly (``from_peer`` = own peer ID) and the LRU drops py-libp2p's local echo. Publishing on a topic
  the node has not subscribed to delivers nothing locally.
* ``from_peer`` is the originator's peer ID (the signed ``from`` field), not the forwarding neighbour.
* Per RPC, a peer's signed peer record is checked once per ``RECORD_TTL`` while its bytes stay the same
  (:func:`node.p2p.gossipsub.cache_signed_records`).
* Gossipsub settings, and the messages held for peers whose subscriptions are not known yet: :mod:`node.p2p.gossipsub`
  (:func:`~node.p2p.gossipsub.make_router`).
* Traffic counters: :class:`GossipCounts`, filled by :func:`count_pubsub_traffic`.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from ..encoding import H
from .framing import RequestTimeout
from .wirelimits import gossip_limit

if TYPE_CHECKING:
    from libp2p.abc import INetStream, ISubscriptionAPI
    from libp2p.peer.id import ID
    from libp2p.pubsub.pb.rpc_pb2 import RPC, Message
    from libp2p.pubsub.pubsub import Pubsub

log = logging.getLogger(__name__)

GossipHandler = Callable[[bytes, str], Awaitable[None]]
GossipValidator = Callable[[bytes, str], bool]  # (data, origin peer id) -> deliver and relay it

GOSSIP_QUEUE = 4096  # messages buffered per topic between the pubsub reader and the handler
DEDUP_SIZE = 65536  # content ids remembered per topic
MAX_GOSSIP = 512 * 1024  # bytes of data per gossip message (py-libp2p caps one pubsub RPC at 1 MiB)
TOPIC_NAMES = ("tx", "consensus", "shards")


class GossipCounts:
    """What one node's pubsub sent and received, counted per kind and short topic name (``tx``, ``consensus``,
    ``shards``; a foreign topic counts under ``other``), for ``/metrics`` and the idle-cost checks.

    * ``sent[(kind, topic)]``: items in RPCs written to peers. ``kind`` is ``publish`` (a message this node
      originated or forwarded, one per receiving peer), ``ihave`` / ``iwant`` (message ids announced / asked for),
      ``graft`` / ``prune``, or ``subscribe`` (``topic`` ``""`` for id-only control items).
    * ``received[topic]``: published messages pushed to this node by peers, duplicates included.
    * ``published[topic]``: messages this node originated (:meth:`Gossip.publish`).
    * ``delivered[topic]``: distinct messages from others handed to this node's handler (after de-duplication).
    """

    def __init__(self) -> None:
        self.sent: Counter[tuple[str, str]] = Counter()
        self.received: Counter[str] = Counter()
        self.published: Counter[str] = Counter()
        self.delivered: Counter[str] = Counter()

    def total_sent(self, kind: str | None = None) -> int:
        """Items sent, all kinds or one ``kind``."""
        return sum(n for (k, _t), n in self.sent.items() if kind is None or k == kind)


def short_topic(topic: str) -> str:
    """``tally/<chain>/[<genesis>/]<name>`` -> ``name`` for Tally's topics, else ``other``."""
    name = topic.rsplit("/", 1)[-1]
    return name if name in TOPIC_NAMES and topic.startswith("tally/") else "other"


def count_pubsub_traffic() -> None:
    """Count every RPC item py-libp2p 0.8.1's ``Pubsub`` writes (``Pubsub.write_msg``) and every published
    message it receives (``Pubsub.push_msg``) into the ``GossipCounts`` at ``pubsub._tally_counts`` when one is
    set (:class:`Gossip` sets it). Idempotent; the library class is patched once per process."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.pubsub.pubsub import Pubsub

    if getattr(Pubsub.write_msg, "_tally", False):
        return
    write_msg, push_msg = Pubsub.write_msg, Pubsub.push_msg

    async def counted_write(self: Pubsub, stream: INetStream, rpc_msg: RPC) -> bool:
        c = getattr(self, "_tally_counts", None)
        if c is not None:
            for m in rpc_msg.publish:
                for t in m.topicIDs:
                    c.sent[("publish", short_topic(t))] += 1
            for s in rpc_msg.subscriptions:
                c.sent[("subscribe", short_topic(s.topicid))] += 1
            if rpc_msg.HasField("control"):
                ctl = rpc_msg.control
                for ih in ctl.ihave:
                    c.sent[("ihave", short_topic(ih.topicID))] += len(ih.messageIDs)
                for iw in ctl.iwant:
                    c.sent[("iwant", "")] += len(iw.messageIDs)
                for g in ctl.graft:
                    c.sent[("graft", short_topic(g.topicID))] += 1
                for pr in ctl.prune:
                    c.sent[("prune", short_topic(pr.topicID))] += 1
        return await write_msg(self, stream, rpc_msg)

    async def counted_push(self: Pubsub, msg_forwarder: ID, msg: Message) -> None:
        c = getattr(self, "_tally_counts", None)
        if c is not None:
            for t in msg.topicIDs:
                c.received[short_topic(t)] += 1
        await push_msg(self, msg_forwarder, msg)

    counted_write.__dict__["_tally"] = True
    Pubsub.write_msg = counted_write  # type: ignore[method-assign]  # the patch itself (same signature)
    Pubsub.push_msg = counted_push  # type: ignore[method-assign]  # the patch itself (same signature)


def _topic_validator(topic: str, validate: GossipValidator | None) -> Callable[[ID, Message], bool]:
    """py-libp2p's synchronous topic validator ``(forwarder ID, rpc Message) -> bool`` around ``validate``: a
    payload over the topic's size in :mod:`node.p2p.wirelimits` is refused first (neither delivered nor
    relayed)."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.peer.id import ID

    limit = gossip_limit(topic).request

    def check(forwarder: ID, msg: Message) -> bool:
        if len(msg.data) > limit:
            log.debug("gossip on %s: refused a payload of %d bytes (limit %d)", topic, len(msg.data), limit)
            return False
        if validate is None:
            return True
        try:
            origin = ID(msg.from_id).to_base58()
        except Exception:  # noqa: BLE001 - a peer's bytes: an undecodable origin is refused
            return False
        try:
            return bool(validate(bytes(msg.data), origin))
        except Exception:
            log.exception("gossip validator for %s failed (message from %s)", topic, origin)
            return False

    return check


class _LRU:
    """A bounded set of recently seen ids (oldest evicted first)."""

    def __init__(self, size: int):
        self.size = size
        self._d: OrderedDict[bytes, None] = OrderedDict()

    def add(self, key: bytes) -> bool:
        """Record ``key``; return False if it was already present."""
        if key in self._d:
            self._d.move_to_end(key)
            return False
        self._d[key] = None
        if len(self._d) > self.size:
            self._d.popitem(last=False)
        return True


class Gossip:
    """Topic subscriptions and publications on a running ``Pubsub``; tasks run in ``nursery``."""

    def __init__(self, pubsub: Pubsub, nursery: trio.Nursery, own_peer_id: str):
        self._pubsub = pubsub
        self._nursery = nursery
        self._own = own_peer_id
        self._subs: dict[str, tuple[_LRU, trio.MemorySendChannel[tuple[bytes, str]]]] = {}
        self.counts = GossipCounts()
        pubsub._tally_counts = self.counts  # type: ignore[attr-defined]  # read by the count_pubsub_traffic patch

    async def subscribe(self, topic: str, handler: GossipHandler, validate: GossipValidator | None = None) -> None:
        """Deliver each distinct content on ``topic`` to ``await handler(data, from_peer)``; handler errors
        are logged. With ``validate``, py-libp2p calls ``validate(data, origin)`` (synchronously, on the event
        loop) before it delivers or relays a message: one it returns False for (or raises on) is neither delivered
        nor forwarded to other peers, and counts against the forwarder in gossipsub's score (libp2p pubsub spec,
        "Message Validation"). The ledger uses it so that a node relays only the transactions its mempool
        admitted, as bitcoind relays only what it accepts: a flood is stopped at the first honest node. A payload
        larger than the topic's entry in :mod:`node.p2p.wirelimits` (``gossip/<name>``) is refused the same way,
        with or without ``validate``.

        Raises:
            RuntimeError: already subscribed to ``topic``.
        """
        if topic in self._subs:
            raise RuntimeError(f"already subscribed to {topic}")
        self._pubsub.set_topic_validator(topic, _topic_validator(topic, validate), False)
        seen = _LRU(DEDUP_SIZE)
        send, recv = trio.open_memory_channel[tuple[bytes, str]](GOSSIP_QUEUE)
        self._subs[topic] = (seen, send)
        sub = await self._pubsub.subscribe(topic)
        self._nursery.start_soon(self._reader, topic, sub, seen, send)
        self._nursery.start_soon(self._worker, topic, handler, recv)

    async def _reader(self, topic: str, sub: ISubscriptionAPI, seen: _LRU,
                      send: trio.MemorySendChannel[tuple[bytes, str]]) -> None:
        # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
        from libp2p.peer.id import ID

        counts, short = self.counts, short_topic(topic)
        async with send:
            while True:
                msg = await sub.get()
                data = bytes(msg.data)
                if not seen.add(H(data)):
                    continue
                counts.delivered[short] += 1
                try:
                    origin = ID(msg.from_id).to_base58()
                except Exception:  # noqa: BLE001 - a peer's bytes: an undecodable origin is left empty
                    origin = ""
                _enqueue(send, topic, data, origin)

    async def _worker(self, topic: str, handler: GossipHandler,
                      recv: trio.MemoryReceiveChannel[tuple[bytes, str]]) -> None:
        async with recv:
            async for data, origin in recv:
                try:
                    await handler(data, origin)
                except Exception:
                    log.exception("gossip handler for %s failed (message from %s)", topic, origin)

    async def publish(self, topic: str, data: bytes) -> None:
        """Sign and publish ``data`` (at most MAX_GOSSIP bytes) on ``topic``.

        Raises:
            TypeError: ``data`` is not bytes.
            ValueError: ``data`` is larger than MAX_GOSSIP.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("gossip data must be bytes")
        if len(data) > MAX_GOSSIP:
            raise ValueError(f"gossip message of {len(data)} bytes exceeds {MAX_GOSSIP}")
        data = bytes(data)
        local = self._subs.get(topic)
        if local is not None and local[0].add(H(data)):
            _enqueue(local[1], topic, data, self._own)  # py-libp2p's local echo is then a duplicate
        self.counts.published[short_topic(topic)] += 1
        await self._pubsub.publish(topic, data)
        # py-libp2p publishes without a checkpoint; let the readers drain its 32-slot subscription queues
        await trio.sleep(0)

    def topic_peers(self, topic: str) -> list[str]:
        """Connected peers known to be subscribed to ``topic``."""
        return [p.to_base58() for p in self._pubsub.peer_topics.get(topic, ())]

    def mesh_peers(self, topic: str) -> list[str]:
        """Peers in this node's gossipsub mesh for ``topic``."""
        return [p.to_base58() for p in self._pubsub.router.mesh.get(topic, ())]

    async def wait_for_topic_peers(self, topic: str, n: int = 1, timeout: float = 5.0, mesh: bool = True) -> None:
        """Wait until at least ``n`` peers are in the mesh for ``topic`` (``mesh=False``: known subscribed).
        Polls every 20 ms.

        Raises:
            RequestTimeout: not reached within ``timeout`` seconds.
        """
        get = self.mesh_peers if mesh else self.topic_peers
        try:
            with trio.fail_after(timeout):
                while len(get(topic)) < n:
                    await trio.sleep(0.02)
        except trio.TooSlowError:
            raise RequestTimeout(f"fewer than {n} peers on {topic} after {timeout} s") from None


def _enqueue(send: trio.MemorySendChannel[tuple[bytes, str]], topic: str, data: bytes, origin: str) -> None:
    try:
        send.send_nowait((data, origin))
    except trio.WouldBlock:
        log.warning("gossip queue for %s full; dropped a message from %s", topic, origin)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


class GossipMethods:
    """The gossip half of :class:`node.p2p.host.P2PHost` (topics, subscribe, publish, mesh), which sets
    ``chain_id``, ``genesis_hash`` and ``_gossip``."""

    chain_id: str
    genesis_hash: bytes | None
    _gossip: Gossip | None

    def _running_gossip(self) -> Gossip:
        """The running :class:`Gossip`.

        Raises:
            RuntimeError: not running.
        """
        if self._gossip is None:
            raise RuntimeError("host is not running (use `async with host.running()`)")
        return self._gossip

    def topic(self, name: str) -> str:
        """Full topic name ``tally/<chain_id>/<genesis hash, 8 bytes hex>/<name>`` (``tally/<chain_id>/<name>``
        without a genesis hash; ``name`` in ``tx``, ``consensus``, ``shards``).

        Raises:
            ValueError: unknown name.
        """
        if name not in TOPIC_NAMES:
            raise ValueError(f"unknown topic {name!r}; expected one of {TOPIC_NAMES}")
        if self.genesis_hash is not None:
            return f"tally/{self.chain_id}/{self.genesis_hash[:8].hex()}/{name}"
        return f"tally/{self.chain_id}/{name}"

    async def subscribe(self, topic: str, handler: GossipHandler, validate: GossipValidator | None = None) -> None:
        """Subscribe to ``topic``: ``await handler(data: bytes, from_peer: str)`` runs once per distinct content,
        in arrival order, own publications included (:mod:`node.p2p.gossip`). Handler errors are logged. A message
        ``validate(data, origin)`` refuses is neither delivered nor relayed (:meth:`Gossip.subscribe`).

        Raises:
            RuntimeError: not running, or already subscribed to ``topic``.
        """
        await self._running_gossip().subscribe(topic, handler, validate)

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
        await self._running_gossip().publish(topic, data)

    def topic_peers(self, topic: str) -> list[str]:
        """Connected peers known to be subscribed to ``topic`` ([] when not running)."""
        return self._gossip.topic_peers(topic) if self._gossip else []

    def gossip_counts(self) -> GossipCounts:
        """This run's gossip traffic counters (:class:`GossipCounts`; empty when not running)."""
        return self._gossip.counts if self._gossip else GossipCounts()

    def mesh_peers(self, topic: str) -> list[str]:
        """Peers in this node's gossipsub mesh for ``topic`` ([] when not running)."""
        return self._gossip.mesh_peers(topic) if self._gossip else []

    async def wait_for_topic_peers(self, topic: str, n: int = 1, timeout: float = 5.0, mesh: bool = True) -> None:
        """Wait until at least ``n`` peers are in the mesh for ``topic`` (``mesh=False``: known subscribed).

        Raises:
            RuntimeError: not running.
            RequestTimeout: not reached within ``timeout`` seconds.
        """
        await self._running_gossip().wait_for_topic_peers(topic, n, timeout, mesh)
