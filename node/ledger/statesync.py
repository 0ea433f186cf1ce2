"""State sync over libp2p: serve this node's latest snapshot; start an empty node from a peer's.

Protocol ``/tally/snapshot/1.0.0``, one request and one reply per stream (msgpack maps):

* ``{"op": "offer"}`` -> ``{"manifest": Manifest wire, "block": the stored record of block h + 1 (its header
  commits to the snapshot's state; its commit certifies the header)}``, or the error ``no_snapshot``;
* ``{"op": "chunk", "snapshot": manifest id, "index": i}`` -> ``{"data": chunk bytes}``.

A :class:`SnapshotServer` keeps the snapshot of the last height that is a multiple of ``every`` blocks (made in
a worker thread from a LevelDB snapshot, so blocks keep being committed), in memory (bytes per live item: the
stored value plus ~40 B). :func:`state_sync` asks every peer for an offer, takes the highest one whose header
carries > 2/3 of the genesis validators' precommits, fetches its chunks, each from the next peer that offered
the same manifest when one is refused (an altered chunk never matches its id; that peer is penalised), checks
the entries against the header's state root and installs them (:func:`node.ledger.snapshot.restore`). The node
then follows the chain from block h + 1 with ordinary block sync. Validators in genesis are trusted, as by the
light client; validator-set changes are not yet followed (issue 13).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from ..p2p.framing import RemoteError, error_reply, read_msg, write_msg
from . import snapshot as snap
from .core.block import InvalidBlock, decode_block
from .core.state import State

log = logging.getLogger(__name__)

SNAPSHOT_PROTOCOL = "/tally/snapshot/1.0.0"
BAD_CHUNK = 5.0  # penalty points for a chunk that does not match its manifest
MAX_REPLY = 8 * snap.CHUNK_BYTES


class SyncHost(Protocol):
    """What state sync needs of the host (:class:`node.p2p.host.P2PHost`)."""

    def set_handler(self, protocol_id: str, handler: Any) -> None: ...

    async def request(self, peer_id: str, protocol_id: str, msg: dict, timeout: float,
                      max_message: int = ...) -> dict: ...

    def penalize(self, peer_id: str, weight: float, ban_s: float | None = None) -> bool: ...


class SnapshotServer:
    """Makes and serves this node's snapshots.

    Args:
        store: the node's :class:`node.ledger.store.LedgerStore`.
        every: make a snapshot when a block whose height is a multiple of this is committed (0: never).
        chunk_bytes: bytes per chunk at most.
    """

    def __init__(self, store: Any, every: int, chunk_bytes: int = snap.CHUNK_BYTES):
        self.store, self.every, self.chunk_bytes = store, every, chunk_bytes
        self.manifest: snap.Manifest | None = None
        self.chunks: dict[bytes, bytes] = {}
        self._making = False

    def install(self, host: SyncHost) -> None:
        host.set_handler(SNAPSHOT_PROTOCOL, self.handle)

    async def on_block(self, height: int) -> None:
        """After block ``height`` is committed: make a snapshot of it when due (in a worker thread)."""
        if not self.every or height % self.every or self._making:
            return
        self._making = True
        try:
            m, chunks = await trio.to_thread.run_sync(snap.make, self.store.db, self.store.genesis.chain_id,
                                                      self.chunk_bytes)
            self.manifest, self.chunks = m, chunks
            log.info("snapshot of height %d: %d chunks, %d bytes", m.height, len(m.chunks),
                     sum(len(c) for c in chunks.values()))
        finally:
            self._making = False

    async def handle(self, stream: Any, peer: str) -> None:
        msg = await read_msg(stream, timeout=10, max_message=1 << 12)
        m = self.manifest
        if m is None:
            await write_msg(stream, error_reply("no_snapshot", "this node has no snapshot yet"))
            return
        if msg.get("op") == "offer":
            block = self.store.get_block_raw(m.height + 1)
            if block is None:  # the next block is not stored yet: offer nothing rather than an unprovable state
                await write_msg(stream, error_reply("no_snapshot", "the snapshot's next block is not stored yet"))
                return
            await write_msg(stream, {"status": "ok", "manifest": m.to_wire(), "block": block})
            return
        if msg.get("op") == "chunk":
            i = msg.get("index")
            if msg.get("snapshot") != m.id or not isinstance(i, int) or not 0 <= i < len(m.chunks):
                await write_msg(stream, error_reply("not_found", "no such snapshot or chunk here"))
                return
            await write_msg(stream, {"status": "ok", "data": self.chunks[m.chunks[i]]}, max_message=MAX_REPLY)
            return
        await write_msg(stream, error_reply("bad_request", "op is offer or chunk"))


async def _offer(host: SyncHost, peer: str, timeout: float) -> tuple[snap.Manifest, Any, Any] | None:
    try:
        reply = await host.request(peer, SNAPSHOT_PROTOCOL, {"op": "offer"}, timeout=timeout)
        m = snap.Manifest.from_wire(reply.get("manifest"))
        wire = reply.get("block")
        block = decode_block(wire["b"] if isinstance(wire, dict) else None)
        return m, block.header, wire.get("c")
    except (RemoteError, snap.SnapshotError, InvalidBlock, KeyError, TypeError) as e:
        log.info("no usable snapshot offer from %s: %s", peer[:16], e)
    except Exception as e:  # unreachable, timed out, reset
        log.info("snapshot offer from %s failed: %s: %s", peer[:16], type(e).__name__, e)
    return None


async def state_sync(store: Any, host: SyncHost, peers: list[str], timeout: float = 30.0) -> State | None:
    """Install the best snapshot offered by ``peers`` into the empty ``store``; None when none checks out.

    Raises:
        snapshot.SnapshotError: the store is not empty.
    """
    if store.head or store.base:
        raise snap.SnapshotError("state sync installs into an empty ledger only")
    validators = store.genesis.validators
    offers: list[tuple[str, snap.Manifest, Any, Any]] = []
    for peer in peers:
        got = await _offer(host, peer, timeout)
        if got is None:
            continue
        m, header, commit = got
        try:
            snap.verify_header(header, commit, validators)
        except InvalidBlock as e:
            log.warning("snapshot offer from %s: its header is not certified: %s", peer[:16], e)
            host.penalize(peer, BAD_CHUNK)
            continue
        offers.append((peer, m, header, commit))
    for _peer, m, header, commit in sorted(offers, key=lambda o: -o[1].height):
        sources = [p for p, m2, _h, _c in offers if m2.id == m.id]
        chunks: list[bytes] = []
        for i in range(len(m.chunks)):
            data = await _chunk(host, sources, m, i, timeout)
            if data is None:
                break
            chunks.append(data)
        if len(chunks) != len(m.chunks):
            continue
        try:
            state = snap.restore(store, m, chunks, header, commit, validators)
        except snap.SnapshotError as e:  # chunks that match a manifest whose entries are not the header's state
            log.warning("snapshot of height %d refused: %s", m.height, e)
            for p in sources:
                host.penalize(p, BAD_CHUNK)
            continue
        log.info("state synced at height %d from %d peer(s): %d chunks", m.height, len(sources), len(chunks))
        return state
    return None


async def _chunk(host: SyncHost, sources: list[str], m: snap.Manifest, i: int, timeout: float) -> bytes | None:
    """Chunk ``i`` from the first source that sends one matching the manifest, rotating the start by ``i``."""
    order = sources[i % len(sources):] + sources[:i % len(sources)]
    for peer in order:
        try:
            reply = await host.request(peer, SNAPSHOT_PROTOCOL, {"op": "chunk", "snapshot": m.id, "index": i},
                                       timeout=timeout, max_message=MAX_REPLY)
            data = reply.get("data")
            if isinstance(data, bytes):
                snap.check_chunk(m, i, data)
                return data
        except snap.SnapshotError as e:
            log.warning("chunk %d from %s refused: %s", i, peer[:16], e)
            host.penalize(peer, BAD_CHUNK)
        except Exception as e:
            log.info("chunk %d from %s failed: %s: %s", i, peer[:16], type(e).__name__, e)
    return None


__all__ = ["SNAPSHOT_PROTOCOL", "SnapshotServer", "state_sync"]
