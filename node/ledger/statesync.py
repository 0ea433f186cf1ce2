"""State sync over libp2p: serve this node's latest snapshot; start an empty node from a peer's.

Protocol ``/tally/snapshot/1.0.0``, one request and one reply per stream (msgpack maps):

* ``{"op": "offer"}`` -> ``{"manifest": Manifest wire, "block": the stored record of block h + 1 (its header
  commits to the snapshot's state; its commit certifies the header)}``, or the error ``no_snapshot``;
* ``{"op": "chunk", "snapshot": manifest id, "index": i}`` -> ``{"data": chunk bytes}``.

A :class:`SnapshotServer` keeps the snapshot of the last height that is a multiple of ``every`` blocks (made in
a worker thread from a LevelDB snapshot, so blocks keep being committed), as files under the data dir
(:mod:`node.ledger.snapstore`: the last 2, served again after a restart) or, without a directory, in memory
(bytes per live item: the stored value plus ~40 B). :func:`state_sync` asks every peer for an offer, takes the highest one whose header
carries > 2/3 of the genesis validators' precommits, fetches its chunks, each from the next peer that offered
the same manifest when one is refused (an altered chunk never matches its id; that peer is penalised), checks
the entries against the header's state root and installs them (:func:`node.ledger.snapshot.restore`). The node
then follows the chain from block h + 1 with ordinary block sync.

Whose precommits certify the header: on a chain whose set is fixed in genesis, the genesis validators'. On one
whose set changes (genesis ``min_validator_bond``, :mod:`node.ledger.core.valset`), the node first follows the
offering peer's headers from genesis to h + 1 with a :class:`node.ledger.proofs.LightClient` (sequential
verification: each commit against the set the previous header named), fetched with

* ``{"op": "light", "from": height, "count": n}`` -> ``{"blocks": [light block, ...]}``
  (:func:`node.ledger.proofs.light_block`: header, commit and the set that signed it; at most
  :data:`LIGHT_BATCH` per request),

and takes the offer only if its header is the one the light client reached.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import trio

from ..p2p.framing import RemoteError, error_reply, read_msg, write_msg
from . import snapshot as snap
from .core.block import Header, InvalidBlock
from .core.state import State
from .core.valset import ValidatorSet
from .proofs import LightClient, light_block, parse_light_block
from .snapstore import KEEP, DiskChunks, SnapshotDir

log = logging.getLogger(__name__)

SNAPSHOT_PROTOCOL = "/tally/snapshot/1.0.0"
BAD_CHUNK = 5.0  # penalty points for a chunk that does not match its manifest
MAX_REPLY = 8 * snap.CHUNK_BYTES
LIGHT_BATCH = 256  # light blocks per "light" request


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
        directory: keep the snapshots there as files (:class:`node.ledger.snapstore.SnapshotDir`: the last
            ``keep``, served from disk, the newest served again after a restart); None: the last one in memory.

    Raises:
        OSError: ``directory`` cannot be created.
    """

    def __init__(self, store: Any, every: int, chunk_bytes: int = snap.CHUNK_BYTES, directory: Path | None = None,
                 keep: int = KEEP):
        self.store, self.every, self.chunk_bytes = store, every, chunk_bytes
        self.manifest: snap.Manifest | None = None
        self.chunks: Any = {}  # chunk id -> bytes: a dict, or DiskChunks reading the directory
        self._making = False
        self.disk = SnapshotDir(directory, keep) if directory is not None else None
        if self.disk is not None:
            m = self.disk.latest()
            if m is not None:
                self.manifest, self.chunks = m, DiskChunks(self.disk, m)
                log.info("serving the snapshot of height %d kept in %s", m.height, directory)

    def _make(self) -> tuple[snap.Manifest, Any, int]:
        """Make a snapshot (a worker thread): into the directory when there is one, else into memory."""
        if self.disk is None:
            m, chunks = snap.make(self.store.db, self.store.genesis.chain_id, self.chunk_bytes)
            return m, chunks, sum(len(c) for c in chunks.values())
        m, _ = snap.make(self.store.db, self.store.genesis.chain_id, self.chunk_bytes, put=self.disk.put_chunk)
        self.disk.write(m)
        chunks = DiskChunks(self.disk, m)
        return m, chunks, chunks.nbytes()

    def install(self, host: SyncHost) -> None:
        host.set_handler(SNAPSHOT_PROTOCOL, self.handle)

    async def on_block(self, height: int) -> None:
        """After block ``height`` is committed: make a snapshot of it when due (in a worker thread)."""
        if not self.every or height % self.every or self._making:
            return
        self._making = True
        try:
            m, chunks, nbytes = await trio.to_thread.run_sync(self._make)
            self.manifest, self.chunks = m, chunks
            log.info("snapshot of height %d: %d chunks, %d bytes%s", m.height, len(m.chunks), nbytes,
                     f" in {self.disk.root}" if self.disk is not None else "")
        except OSError as e:  # a full or failing disk: keep serving the previous snapshot
            log.error("snapshot of height %d not written: %s", height, e)
        finally:
            self._making = False

    async def _light(self, stream: Any, msg: dict[str, Any]) -> None:
        await write_msg(stream, await _light_handler_reply(self.store, msg), max_message=MAX_REPLY)

    async def handle(self, stream: Any, peer: str) -> None:
        msg = await read_msg(stream, timeout=10, max_message=1 << 12)
        if msg.get("op") == "light":
            await self._light(stream, msg)
            return
        m = self.manifest
        if m is None:
            await write_msg(stream, error_reply("no_snapshot", "this node has no snapshot yet"))
            return
        if msg.get("op") == "offer":
            block = self.store.get_header_raw(m.height + 1)  # its header and commit (its body may be pruned)
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
            data = self.chunks.get(m.chunks[i])
            if data is None:  # a chunk file damaged on disk (snapstore logs it)
                await write_msg(stream, error_reply("not_found", "this chunk is not readable here"))
                return
            await write_msg(stream, {"status": "ok", "data": data}, max_message=MAX_REPLY)
            return
        await write_msg(stream, error_reply("bad_request", "op is offer or chunk"))


async def _light_handler_reply(store: Any, msg: dict[str, Any]) -> dict[str, Any]:
    lo, n = msg.get("from"), msg.get("count")
    if not (isinstance(lo, int) and isinstance(n, int) and lo >= 1 and 1 <= n <= LIGHT_BATCH):
        return error_reply("bad_request", f"from >= 1 and 1 <= count <= {LIGHT_BATCH}")
    blocks = []
    for h in range(lo, min(store.head, lo + n - 1) + 1):
        try:
            blocks.append(light_block(store, h))
        except KeyError:
            break
    return {"status": "ok", "head": store.head, "blocks": blocks}


async def follow_headers(host: SyncHost, peer: str, genesis: Any, height: int,
                         timeout: float = 30.0) -> LightClient:
    """A :class:`LightClient` that followed ``peer``'s headers from genesis to ``height``.

    Raises:
        InvalidBlock: a header, commit or validator set that does not verify, or the peer ran out of headers.
    """
    lc = LightClient(genesis)
    while lc.height < height:
        n = min(LIGHT_BATCH, height - lc.height)
        reply = await host.request(peer, SNAPSHOT_PROTOCOL, {"op": "light", "from": lc.height + 1, "count": n},
                                   timeout=timeout, max_message=MAX_REPLY)
        blocks = reply.get("blocks") or []
        if not blocks:
            raise InvalidBlock(f"{peer[:16]} has no headers after {lc.height}")
        lc.follow(parse_light_block(b) for b in blocks[:n])
    return lc


def _header(h: Any) -> Header:
    """The header of a block whose body is not sent (the offering node pruned it): its fields type-checked as
    :func:`node.ledger.core.block.decode_block` checks them (the commit over its hash is checked by the caller).

    Raises:
        InvalidBlock: malformed.
    """
    if not (isinstance(h, list) and len(h) in (7, 9) and isinstance(h[0], str) and isinstance(h[1], int)
            and h[1] >= 1 and isinstance(h[3], int)
            and all(isinstance(x, bytes) and len(x) == 32 for x in (h[2], *h[4:]))):
        raise InvalidBlock("malformed header")
    return Header(*h)


async def _offer(host: SyncHost, peer: str, timeout: float) -> tuple[snap.Manifest, Any, Any] | None:
    try:
        reply = await host.request(peer, SNAPSHOT_PROTOCOL, {"op": "offer"}, timeout=timeout)
        m = snap.Manifest.from_wire(reply.get("manifest"))
        wire = reply.get("block")
        if not isinstance(wire, dict) or not isinstance(wire.get("b"), dict):
            raise InvalidBlock("malformed block in the offer")
        # only the header counts (its commit is checked next): a pruned body comes without its txs
        return m, _header(wire["b"].get("h")), wire.get("c")
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
    fixed = not store.genesis.params.min_validator_bond
    validators: tuple[bytes, ...] | ValidatorSet = store.genesis.validators
    offers: list[tuple[str, snap.Manifest, Any, Any, Any]] = []
    for peer in peers:
        got = await _offer(host, peer, timeout)
        if got is None:
            continue
        m, header, commit = got
        try:
            if not fixed:  # follow the validator changes from genesis up to the offer's header
                try:
                    lc = await follow_headers(host, peer, store.genesis, header.height, timeout)
                except InvalidBlock:
                    raise
                except Exception as e:  # unreachable, timed out, an error reply
                    log.info("headers from %s failed: %s: %s", peer[:16], type(e).__name__, e)
                    continue
                if lc.header is None or lc.header.hash != header.hash:
                    raise InvalidBlock("the offered header is not the chain's header at its height")
                validators = lc.valset
            snap.verify_header(header, commit, validators)
        except InvalidBlock as e:
            log.warning("snapshot offer from %s: its header is not certified: %s", peer[:16], e)
            host.penalize(peer, BAD_CHUNK)
            continue
        offers.append((peer, m, header, commit, validators))
    for _peer, m, header, commit, validators in sorted(offers, key=lambda o: -o[1].height):
        sources = [p for p, m2, _h, _c, _v in offers if m2.id == m.id]
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
