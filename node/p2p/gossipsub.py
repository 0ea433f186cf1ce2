"""py-libp2p's gossipsub as Tally runs it: the router's settings and the work-arounds patched into py-libp2p 0.8.1's
pubsub (its outbound queue, its stream retry, its signed-record checks). :mod:`node.p2p.gossip` is what the node
uses on top (subscriptions, de-duplication, counters); :meth:`node.p2p.host.P2PHost.running` applies these.

* :func:`make_router` -- ``GossipSub`` with protocols ``/meshsub/1.1.0`` and ``/meshsub/1.0.0``; spam protection off
  (py-libp2p's default drops above 10 messages/s per peer and topic); adaptive gossip off (it stretches the
  heartbeat to 30-60 s when it judges the network unhealthy, as small networks are); eclipse protection off (all
  loopback peers share one IP); messages held for peers whose subscriptions are not known yet capped at
  ``PENDING_PER_PEER`` per peer for ``PENDING_TTL`` seconds, pruned in O(1) and dropped without a log line.
* :func:`raise_outbound_queue`, :func:`retry_pubsub_streams`, :func:`cache_signed_records` -- idempotent patches,
  each described in its docstring.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from libp2p.abc import IHost
    from libp2p.peer.id import ID
    from libp2p.pubsub.gossipsub import GossipSub
    from libp2p.pubsub.pb.rpc_pb2 import RPC
    from libp2p.pubsub.pubsub import Pubsub

__all__ = ["OUTBOUND_QUEUE", "PENDING_PER_PEER", "PENDING_TTL", "RECORD_CACHE", "RECORD_TTL", "cache_signed_records",
           "make_router", "raise_outbound_queue", "retry_pubsub_streams", "router_class"]

OUTBOUND_QUEUE = 4096  # RPCs queued per peer by pubsub before it drops (py-libp2p default: 32)
RECORD_CACHE = 4096  # signed peer records remembered as already checked (cache_signed_records)
RECORD_TTL = 600.0  # seconds a checked signed peer record is taken as checked
PENDING_PER_PEER = 32  # publications held per peer until its subscriptions are known (py-libp2p default: 100)
PENDING_TTL = 5.0  # seconds such a publication is held (py-libp2p default: 30 s)


@cache
def router_class() -> type[GossipSub]:
    """py-libp2p's ``GossipSub`` with a cheap pending queue. py-libp2p 0.8.1 queues every publication for each
    connected peer that has not subscribed to the topic (in case its subscription is still on the way), and on
    every publication rebuilds each such peer's queue in a list comprehension and, once the queue is at its cap,
    logs a WARNING. A peer that connects and never subscribes to a topic thus costs every node O(cap) work and
    a log record per publication on it, for as long as it stays connected. Measured on the validator of
    ``tests/e2e/test_flood.py`` (swarm, six flooding peers subscribed only to ``tx``): 9,443 warnings and 12 s
    of its event loop in _prune_pending_messages during a 2.5-minute test, block intervals 7-10 % longer than
    idle. This subclass keeps the same queue (appended in time order) but drops expired entries from its head
    only when the oldest has expired, trims the oldest beyond the cap without a log line, and uses
    ``PENDING_PER_PEER`` / ``PENDING_TTL``."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.pubsub.gossipsub import GossipSub

    class TallyGossipSub(GossipSub):
        def _prune_pending_messages(self, peer_id: ID) -> None:
            queue = self._pending_messages.get(peer_id)
            if queue is None:
                return
            cutoff = time.time() - self._pending_messages_ttl
            if queue and queue[0][0] < cutoff:  # entries are appended with time.time(): oldest first
                queue[:] = [(ts, m) for ts, m in queue if ts >= cutoff]
            over = len(queue) - self._max_pending_messages_per_peer
            if over > 0:
                del queue[:over]
            if not queue:
                self._pending_messages.pop(peer_id, None)

    return TallyGossipSub


def make_router(*, degree: int, degree_low: int, degree_high: int, heartbeat_interval: float) -> GossipSub:
    """A ``GossipSub`` router with Tally's settings (see module docstring). ``heartbeat_interval`` in seconds."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11

    return router_class()(
        protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=degree, degree_low=degree_low, degree_high=degree_high,
        # py-libp2p annotates the interval as int seconds; it sleeps on whatever number it is given
        heartbeat_initial_delay=0.1, heartbeat_interval=heartbeat_interval,  # type: ignore[arg-type]
        spam_protection_enabled=False, max_messages_per_topic_per_second=1e9,
        adaptive_gossip_enabled=False,
        eclipse_protection_enabled=False,
        max_pending_messages_per_peer=PENDING_PER_PEER, pending_messages_ttl=PENDING_TTL,
    )


def raise_outbound_queue() -> None:
    """py-libp2p 0.8.1 gives every peer a pubsub send queue of 32 RPCs (``RpcQueue()`` in
    ``libp2p.pubsub.pubsub``) and drops RPCs when it is full, so a burst of more than ~32 publications loses
    messages. Point that module's ``RpcQueue`` at a subclass with ``OUTBOUND_QUEUE`` slots (idempotent; the
    library class itself is unchanged)."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.pubsub import pubsub as pubsub_imported
    from libp2p.pubsub.rpc_queue import DefaultMaxMessageSize, RpcQueue

    # the module imports RpcQueue without re-exporting it: patched here as a plain namespace
    pubsub_mod: Any = pubsub_imported

    if getattr(pubsub_mod.RpcQueue, "_tally", False):
        return

    class _DeepRpcQueue(RpcQueue):
        _tally = True

        def __init__(self, max_size: int = OUTBOUND_QUEUE, max_message_size: int = DefaultMaxMessageSize):
            super().__init__(max_size, max_message_size)

    pubsub_mod.RpcQueue = _DeepRpcQueue  # the patch itself: a subclass of the same class


def retry_pubsub_streams() -> None:
    """py-libp2p 0.8.1 keeps retrying to open a newly connected peer's pubsub stream (backoff 0.5 s doubling to
    10 s, while the peer stays connected) only on ``SwarmException`` and ``StreamClosed``; a protocol negotiation
    that times out raises ``StreamFailure``, which ``Pubsub._handle_new_peer_with_retry`` takes for final. The
    peer then stays connected but outside gossip for good: it never receives a block, transaction or span
    announcement from this node. Seen on two loaded cores: a client process busy loading its model did not answer
    the validator's ``/meshsub`` negotiation within 10 s, and never heard a single server. Patch
    ``Pubsub._handle_new_peer`` to raise ``StreamFailure`` as a ``SwarmException`` so that the library's own
    retry loop handles it (idempotent; the library class is patched once per process)."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.host.exceptions import StreamFailure
    from libp2p.network.exceptions import SwarmException
    from libp2p.pubsub.pubsub import Pubsub

    original = Pubsub._handle_new_peer
    if getattr(original, "_tally", False):
        return

    async def _handle_new_peer(self: Pubsub, peer_id: ID) -> None:
        try:
            await original(self, peer_id)
        except StreamFailure as e:
            raise SwarmException(f"pubsub stream to {peer_id}: {e}") from e

    _handle_new_peer.__dict__["_tally"] = True
    Pubsub._handle_new_peer = _handle_new_peer  # type: ignore[method-assign]  # the patch itself (same signature)


def cache_signed_records(size: int = RECORD_CACHE, ttl: float = RECORD_TTL) -> None:
    """py-libp2p 0.8.1 attaches its signed peer record (an Envelope) to every pubsub RPC, and the receiver
    parses it, checks its Ed25519 signature and stores it in the peerstore for every RPC
    (``libp2p.pubsub.utils.maybe_consume_signed_record``), although a peer sends the same cached bytes until its
    addresses change. Skip that work for bytes this host already accepted from that peer in the last ``ttl``
    seconds (at most ``size`` entries, oldest forgotten; a changed record, or one past ``ttl``, which refreshes the
    peerstore's 2 h TTL, is consumed as before). Patches the name in ``libp2p.pubsub.pubsub`` and
    ``libp2p.pubsub.gossipsub`` (idempotent; the library function itself is unchanged)."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.pubsub import gossipsub as gossipsub_imported, pubsub as pubsub_imported

    # both modules import the function without re-exporting it: patched here as plain namespaces
    pubsub_mod: Any = pubsub_imported
    gossipsub_mod: Any = gossipsub_imported

    original: Callable[[RPC, IHost, ID], bool] = pubsub_mod.maybe_consume_signed_record
    if getattr(original, "_tally", False):
        return
    accepted: OrderedDict[tuple[bytes, bytes, bytes], float] = OrderedDict()  # (host id, peer id, record bytes) -> when

    def consume(msg: RPC, host: IHost, peer_id: ID) -> bool:
        if not msg.HasField("senderRecord"):
            return True
        key = (host.get_id().to_bytes(), peer_id.to_bytes(), msg.senderRecord)
        now = time.monotonic()
        when = accepted.get(key)
        if when is not None and now - when < ttl:
            return True
        ok = original(msg, host, peer_id)
        if ok:
            accepted[key] = now
            accepted.move_to_end(key)
            if len(accepted) > size:
                accepted.popitem(last=False)
        return ok

    consume.__dict__["_tally"] = True
    pubsub_mod.maybe_consume_signed_record = consume
    gossipsub_mod.maybe_consume_signed_record = consume
