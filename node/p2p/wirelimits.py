"""One table of wire limits for every protocol Tally speaks, and the node-wide budget for large reads.

Every message from a peer is bounded before it is read (:func:`node.p2p.framing.read_msg` looks the stream's
protocol up here when its caller names no size) and decoded under the entry's depth and cost limits
(:func:`node.encoding.unpack`): a protocol missing from the table gets :data:`DEFAULT`, 64 KiB, so a large limit
is always a deliberate entry. ``tests/p2p/test_wirelimits.py`` fails when a ``*_PROTOCOL`` constant in ``node/``
has no entry here. The protocol ids are spelled out (not imported from their modules, which all import
:mod:`node.p2p.framing`, which imports this module).

Gossip payloads are bounded by the entries ``gossip/<topic>`` (:func:`gossip_limit`), checked before delivery
in :mod:`node.p2p.gossip`; py-libp2p itself refuses an inbound pubsub RPC over 1 MiB
(``Pubsub(max_inbound_rpc_size=DefaultMaxMessageSize)``), and a publication is at most
``gossip.MAX_GOSSIP`` = 512 KiB.

Large reads: a message that grows beyond :data:`LARGE_READ` (1 MiB) reserves its bytes, frame by frame, from
one pool shared by all peers and streams of the process (:data:`READ_BUDGET`, 256 MiB by default, settable with
:meth:`ReadBudget.configure`); when the pool is empty the read fails at once with
:class:`~node.p2p.framing.Busy` (code ``busy``) instead of allocating, and the bytes return to the pool when the
message is decoded or its read fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..encoding import COST_RATIO, COST_SLACK, MAX_DEPTH, MAX_MESSAGE

KIB, MIB = 1 << 10, 1 << 20
LARGE_READ = 1 * MIB  # bytes: a message beyond this size reserves from the node-wide pool
READ_POOL = 256 * MIB  # bytes: the default size of that pool
READ_PER_PEER = MAX_MESSAGE + 8 * MIB  # bytes: what one peer's large reads may hold of it at once


@dataclass(frozen=True)
class WireLimit:
    """Limits of one protocol's messages, as read by this node.

    Attributes:
        request: largest request a server reads, in bytes (packed msgpack, all frames together).
        reply: largest reply a client reads, in bytes.
        objects: most msgpack objects in one message, containers and scalars (``None``: only the cost bound).
        depth: deepest container nesting in one message.
        timeout: seconds allowed to read one message when the caller names no deadline.
        cost_ratio: estimated bytes of decoded Python objects per wire byte (:func:`node.encoding.unpack`); a
            message of N bytes costs at most ``cost_ratio x N + COST_SLACK`` bytes of memory.
    """

    request: int
    reply: int
    objects: int | None = None
    depth: int = MAX_DEPTH
    timeout: float = 10.0
    cost_ratio: float = 4.0

    def largest(self) -> int:
        """The larger of :attr:`request` and :attr:`reply`, in bytes (a stream whose direction is unknown)."""
        return max(self.request, self.reply)

    def budget(self, size: int) -> int:
        """Estimated bytes of Python objects a message of ``size`` bytes may decode to."""
        return int(COST_SLACK + self.cost_ratio * size)


DEFAULT = WireLimit(request=64 * KIB, reply=64 * KIB, objects=4096, depth=16)  # a protocol not in the table
# a stream object with no ``get_protocol`` is no libp2p stream but an in-process pipe (tests, a GPU box's local
# pipeline): it keeps the historical 64 MiB message limit, under the decode cost bound of bulk protocols
IN_PROCESS = WireLimit(request=MAX_MESSAGE, reply=MAX_MESSAGE, timeout=30.0, cost_ratio=8.0)

# protocol id -> limits. An entry decodes at most 4 bytes of Python objects per wire byte (+ 64 KiB): bulk
# payloads (tensors, files, snapshot chunks) decode at ~1-2.6x (measured with tracemalloc) and small messages fit
# in the slack. Sync and light-header replies carry whole blocks as maps: 2,000 receipts decode at 3.4x, 2,000
# transfers at 4.3x (estimated 5.0x), so they get 8x. Bulk replies also cap their object count, which bounds
# the walk (~0.3-1 us per object on the event loop) before the decode.
BULK_OBJECTS = 1 << 16
TABLE: dict[str, WireLimit] = {
    # before and around the genesis handshake: a few KiB (a hello is ~0.3-2 KiB: 8 addresses at most)
    "/tally/hello/1.0.0": WireLimit(request=8 * KIB, reply=8 * KIB, objects=256, depth=4),
    "/tally/dialback/1.0.0": WireLimit(request=4 * KIB, reply=4 * KIB, objects=128, depth=4),
    # a reply holds at most 32 peers x 4 addresses
    "/tally/peers/1.0.0": WireLimit(request=1 * KIB, reply=64 * KIB, objects=1024, depth=4),
    # span records (node.discovery): a store carries one record of at most 2 KiB, a find's reply at most 32
    "/tally/discovery/1.0.0": WireLimit(request=4 * KIB, reply=72 * KIB, objects=128, depth=4, timeout=5.0),
    # open/ack/close are 4 KiB (server.CONTROL_MAX); a step carries hidden states, sized by the server per session
    "/tally/inference/2.0.0": WireLimit(request=MAX_MESSAGE, reply=MAX_MESSAGE, objects=BULK_OBJECTS, depth=8,
                                        timeout=30.0),
    # a snapshot chunk or a run of light headers, statesync.MAX_REPLY = 8 x 1 MiB
    "/tally/snapshot/1.0.0": WireLimit(request=4 * KIB, reply=8 * MIB, depth=16, timeout=30.0, cost_ratio=8.0),
    # up to 64 blocks as wire maps (ledger.service.SYNC_BATCH; a reply of blocks of receipts nests 7 deep)
    "/tally/sync/1.0.0": WireLimit(request=4 * KIB, reply=MAX_MESSAGE, depth=16, timeout=20.0, cost_ratio=8.0),
    # one transaction (ledger.service.MAX_TX_WIRE)
    "/tally/submit/1.0.0": WireLimit(request=64 * KIB + 1 * KIB, reply=4 * KIB, depth=16),
    # a model block file (blockfetch.MAX_FILE = 48 MiB) or manifests
    "/tally/block/1.0.0": WireLimit(request=4 * KIB, reply=48 * MIB + 64 * KIB, objects=BULK_OBJECTS, depth=8,
                                    timeout=60.0),
    # a batch item file (batch.items.MAX_FILE_BYTES = 32 MiB) or a result
    "/tally/batch/1.0.0": WireLimit(request=4 * KIB, reply=32 * MIB + 64 * KIB, objects=BULK_OBJECTS, depth=8,
                                    timeout=20.0),
    # a blob: a list of wire tensors
    "/tally/blob/1.0.0": WireLimit(request=4 * KIB, reply=MAX_MESSAGE, objects=BULK_OBJECTS, depth=8,
                                   timeout=60.0),
    # gossip payloads by topic (node.p2p.gossip.TOPIC_NAMES): a transaction, a block or vote, a span record. The
    # size is checked by the topic validator; the topic's handler decodes with unpack's defaults (listed here)
    "gossip/tx": WireLimit(request=64 * KIB, reply=0, cost_ratio=COST_RATIO),
    "gossip/consensus": WireLimit(request=512 * KIB, reply=0, cost_ratio=COST_RATIO),
    "gossip/shards": WireLimit(request=16 * KIB, reply=0, cost_ratio=COST_RATIO),
}


def limit_for(protocol: str | None) -> WireLimit:
    """The limits of ``protocol`` (a protocol id, or ``gossip/<topic>``); :data:`DEFAULT` when it has none."""
    if protocol is None:
        return DEFAULT
    return TABLE.get(str(protocol), DEFAULT)


def markdown_table() -> str:
    """The table as Markdown (protocol, request, reply, objects, depth, timeout, decode cost), for
    ``docs/security.md``; sizes in KiB or MiB."""

    def size(n: int) -> str:
        return "-" if n == 0 else f"{n / MIB:g} MiB" if n >= MIB else f"{n / KIB:g} KiB"

    rows = ["| protocol | request | reply | objects | depth | read timeout | decoded at most |",
            "|---|---|---|---|---|---|---|"]
    for name, lim in [*TABLE.items(), ("any other protocol", DEFAULT)]:
        rows.append(f"| `{name}` | {size(lim.request)} | {size(lim.reply)} | "
                    f"{'-' if lim.objects is None else lim.objects} | {lim.depth} | "
                    f"{'-' if name.startswith('gossip/') else f'{lim.timeout:g} s'} | "
                    f"{lim.cost_ratio:g} x size + {COST_SLACK // KIB} KiB |")
    return "\n".join(rows)


def gossip_limit(topic: str) -> WireLimit:
    """The limits of a gossip payload on ``topic`` (``tally/<chain>/<name>`` or the short name)."""
    return limit_for("gossip/" + topic.rsplit("/", 1)[-1])


def stream_limit(stream: object) -> tuple[WireLimit, int]:
    """The limits of what this node reads from ``stream`` and the largest message size, in bytes.

    The protocol comes from ``stream.get_protocol()`` (py-libp2p's ``INetStream``); the direction from its muxed
    stream's ``is_initiator``: a stream this node opened reads replies, one it accepted reads requests, and one
    of unknown direction the larger of both. A libp2p stream whose protocol is unknown or not set gets
    :data:`DEFAULT`; an object without ``get_protocol`` (an in-process pipe) gets :data:`IN_PROCESS`.
    """
    get = getattr(stream, "get_protocol", None)
    if not callable(get):
        return IN_PROCESS, IN_PROCESS.largest()
    lim = limit_for(get())
    initiator = getattr(getattr(stream, "muxed_stream", None), "is_initiator", None)
    if initiator is True:
        return lim, lim.reply
    if initiator is False:
        return lim, lim.request
    return lim, lim.largest()


class ReadBudget:
    """A pool of bytes shared by every large read of the process, with a cap per peer (trio is single-threaded:
    no lock).

    Args:
        capacity: bytes in the pool.
        per_peer: bytes one peer's reads may hold at once (:data:`READ_PER_PEER`: one largest message and a
            little more), so a single peer dripping large messages cannot take the whole pool from the others.

    :meth:`take` and :meth:`give` move bytes out of and back into the pool; ``available`` is what is left and
    ``held`` what each peer holds now (a peer at zero has no entry).
    """

    def __init__(self, capacity: int = READ_POOL, per_peer: int = READ_PER_PEER):
        self.capacity = capacity
        self.available = capacity
        self.per_peer = per_peer
        self.held: dict[str, int] = {}  # peer -> bytes it holds now; only peers holding something
        self.refused = 0  # reads refused because the pool or the peer's share was full (for /metrics and tests)

    def configure(self, capacity: int, per_peer: int | None = None) -> None:
        """Resize the pool to ``capacity`` bytes (what is out stays out), and the per-peer cap if given.

        Raises:
            ValueError: ``capacity`` or ``per_peer`` is negative.
        """
        if capacity < 0 or (per_peer is not None and per_peer < 0):
            raise ValueError("capacity and per_peer must be >= 0 bytes")
        self.available += capacity - self.capacity
        self.capacity = capacity
        if per_peer is not None:
            self.per_peer = per_peer

    def take(self, n: int, peer: str | None = None) -> bool:
        """Reserve ``n`` bytes for ``peer`` (None: a read of no known peer, held to the pool alone); False (and
        nothing reserved) when the pool or the peer's share has less room."""
        mine = self.held.get(peer, 0) if peer is not None else 0
        if n > self.available or (peer is not None and mine + n > self.per_peer):
            self.refused += 1
            return False
        self.available -= n
        if peer is not None:
            self.held[peer] = mine + n
        return True

    def give(self, n: int, peer: str | None = None) -> None:
        """Return ``n`` bytes reserved with :meth:`take` for the same ``peer``."""
        self.available += n
        if peer is not None:
            left = self.held.get(peer, 0) - n
            if left > 0:
                self.held[peer] = left
            else:
                self.held.pop(peer, None)

    def full(self) -> bool:
        """Whether every byte is back in the pool."""
        return self.available == self.capacity and not self.held


READ_BUDGET = ReadBudget()  # the node-wide pool (one node per process; READ_BUDGET.configure to resize)
