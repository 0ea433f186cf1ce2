"""State sync over libp2p: serve this node's latest snapshot; start an empty node from a peer's.

Protocol ``/tally/snapshot/1.0.0``, one request and one reply per stream (msgpack maps):

* ``{"op": "offer"}`` -> ``{"manifest": Manifest wire, "block": {"b": {"h": header list}, "c": commit}}`` (the
  header of block h + 1, which commits to the snapshot's state, and the commit that certifies it), or the error
  ``no_snapshot``;
* ``{"op": "chunk", "snapshot": manifest id, "index": i}`` -> ``{"data": chunk bytes}``, or the error ``busy``
  (the server's reply budget is full: ask again or ask another peer).

A :class:`SnapshotServer` keeps the snapshot of the last height that is a multiple of ``every`` blocks (made in
a worker thread from a LevelDB snapshot, so blocks keep being committed), as files under the data dir
(:mod:`node.ledger.snapstore`: the last 2, served again after a restart) or, without a directory, in memory
(bytes per live item: the stored value plus ~40 B). It offers the newest kept snapshot whose next block is
stored, and serves the chunks of every kept one by manifest id. It streams a chunk file from disk one frame at a
time, under a write deadline per frame and per reply, while its bytes are reserved in a
:class:`node.p2p.budget.ReplyBudget` (per peer and node-wide; ``busy`` when full).

:func:`state_sync` asks every peer for an offer (at once, each under a time budget) and checks each offer
before it fetches a single chunk: its shape, the header's commit (> 2/3 of the validators' precommits) and
everything that binds the manifest to that header (:func:`node.ledger.snapshot.check_manifest`: chain, height,
parent hash, state root, and bounds on what no header binds). Any failure of one offer — malformed, uncertified,
an error reply, a timeout, anything raised — costs that peer a penalty and nothing else. Offers are then tried
in order of *certified* height (the header's), most sources first, fewest chunks first; the chunks of one are
fetched from all the peers that offered the same manifest at once, each source within a time budget
(:mod:`node.ledger.syncfetch`, :class:`~node.ledger.syncfetch.SyncLimits`), written to a spool on disk
(:class:`node.ledger.snapstore.ChunkSpool`), then checked against the header's state root and installed
(:func:`node.ledger.snapshot.restore`). The node then follows the chain from block h + 1 with ordinary block
sync.

What a lying peer can still cost. Nothing in a header binds a manifest's chunk ids: only the state root that
:func:`~node.ledger.snapshot.restore` recomputes once every chunk is in. A peer holding a real certified header
can therefore list chunks of invented entries under the real root. Such a manifest is fetched only if no
manifest of a higher certified height, more sources or fewer chunks comes first (honest peers that snapshot the
same height with the default chunk size offer the same manifest, so one liar is outnumbered), so it costs at
most as many chunk fetches as the honest snapshot it undercuts (each at most 4 MiB) and never more than
``SyncLimits.max_bytes``; it is then refused and its sources penalised and dropped. A manifest of a height no
validator set certified costs one offer.

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
from typing import Any, BinaryIO, cast

import trio

from ..encoding import pack
from ..p2p.budget import Busy, ReplyBudget
from ..p2p.filesend import MAX_PREFIX, STALL, STREAM_HOLD, reply_deadline, write_error, write_file_msg
from ..p2p.framing import RemoteError, StreamClosed, read_msg, write_msg
from . import snapshot as snap
from .core.block import Header, InvalidBlock
from .core.state import State
from .core.valset import ValidatorSet
from .genesis import Genesis
from .proofs import LightClient, light_block, parse_light_block, verify_header
from .seams import MsgStream
from .snapstore import KEEP, ChunkSpool, DiskChunks, SnapshotDir
from .store import LedgerStore
from .syncfetch import (
    BAD_CHUNK,
    BAD_OFFER,
    LYING,
    SLOW,
    SNAPSHOT_PROTOCOL,
    Offer,
    Source,
    SourceState,
    SyncHost,
    SyncLimits,
    drop,
    fetch,
)

log = logging.getLogger(__name__)

MAX_REPLY = 8 * snap.CHUNK_BYTES  # bytes: a "light" reply at most
MAX_REQUEST = 1 << 12  # bytes: a request at most
REQUEST_READ_S = 10.0  # seconds to read a request
LIGHT_BATCH = 256  # light blocks per "light" request


class SnapshotServer:
    """Makes and serves this node's snapshots.

    Args:
        store: the node's :class:`node.ledger.store.LedgerStore`.
        every: make a snapshot when a block whose height is a multiple of this is committed (0: never).
        chunk_bytes: bytes per chunk at most.
        directory: keep the snapshots there as files (:class:`node.ledger.snapstore.SnapshotDir`: the last
            ``keep``, served from disk, the newest served again after a restart); None: the last one in memory.
        budget: the node's :class:`node.p2p.budget.ReplyBudget`, shared with its other bulk protocols (None: one
            of this server's own, with the default caps: 32 MiB per peer, 256 MiB node-wide).

    Raises:
        OSError: ``directory`` cannot be created.
    """

    def __init__(self, store: LedgerStore, every: int, chunk_bytes: int = snap.CHUNK_BYTES,
                 directory: Path | None = None, keep: int = KEEP, budget: ReplyBudget | None = None) -> None:
        self.store, self.every, self.chunk_bytes = store, every, chunk_bytes
        self.manifest: snap.Manifest | None = None
        self.chunks: Any = {}  # chunk id -> bytes: a dict, or DiskChunks reading the directory
        self._making = False
        self.budget = budget if budget is not None else ReplyBudget()
        self.stall_s = STALL  # seconds one frame of a chunk reply may take to write (a reader that stops is cut)
        self.kept: dict[bytes, snap.Manifest] = {}  # manifest id -> manifest: whose chunks are served
        self.disk = SnapshotDir(directory, keep) if directory is not None else None
        if self.disk is not None:
            m = self.disk.latest()
            if m is not None and m.chain_id != store.genesis.domain:  # another genesis, or signed the old way
                log.warning("the snapshots kept in %s are of another network or an older version: not served",
                            directory)
                m = None
            if m is not None:
                self.manifest, self.chunks = m, DiskChunks(self.disk, m)
                self.kept = self._kept_on_disk(self.disk, m)
                log.info("serving the snapshot of height %d kept in %s", m.height, directory)

    @staticmethod
    def _kept_on_disk(disk: SnapshotDir, latest: snap.Manifest) -> dict[bytes, snap.Manifest]:
        """The snapshots kept in ``disk`` up to ``latest`` (their chunks stay there until a newer one replaces
        them): a peer midway through fetching the previous one can finish it."""
        kept = {m.id: m for m in disk.manifests() if m.height <= latest.height and m.chain_id == latest.chain_id}
        kept[latest.id] = latest
        return kept

    def _make(self) -> tuple[snap.Manifest, Any, int]:
        """Make a snapshot (a worker thread): into the directory when there is one, else into memory."""
        if self.disk is None:
            m, chunks = snap.make(self.store.db, self.store.genesis.domain, self.chunk_bytes)
            return m, chunks, sum(len(c) for c in chunks.values())
        m, _ = snap.make(self.store.db, self.store.genesis.domain, self.chunk_bytes, put=self.disk.put_chunk)
        self.disk.write(m)
        on_disk = DiskChunks(self.disk, m)
        return m, on_disk, on_disk.nbytes()

    def install(self, host: SyncHost) -> None:
        host.set_handler(SNAPSHOT_PROTOCOL, self.handle)

    async def on_block(self, height: int) -> None:
        """After block ``height`` is committed: make a snapshot of it when due (in a worker thread)."""
        if not self.every or height % self.every or self._making:
            return
        self._making = True
        try:
            m, chunks, nbytes = await trio.to_thread.run_sync(self._make)
            kept = ({m.id: m} if self.disk is None
                    else await trio.to_thread.run_sync(self._kept_on_disk, self.disk, m))
            self.manifest, self.chunks, self.kept = m, chunks, kept
            log.info("snapshot of height %d: %d chunks, %d bytes%s", m.height, len(m.chunks), nbytes,
                     f" in {self.disk.root}" if self.disk is not None else "")
        except OSError as e:  # a full or failing disk: keep serving the previous snapshot
            log.error("snapshot of height %d not written: %s", height, e)
        finally:
            self._making = False

    def offerable(self) -> tuple[snap.Manifest, dict[str, Any]] | None:
        """The newest kept snapshot whose next block is stored, with that block's header and commit (``{"b":
        {"h": header list}, "c": commit}``: its body is not needed), or None. Right after a snapshot is made its
        next block is not committed yet: the previous one is offered meanwhile."""
        for m in sorted(self.kept.values(), key=lambda k: -k.height):
            block = self.store.get_header_raw(m.height + 1)  # its header and commit (its body may be pruned)
            if block is not None:
                return m, {"b": {"h": block["b"]["h"]}, "c": block["c"]}
        return None

    async def _reply(self, stream: MsgStream, peer: str, reply: dict[str, Any], limit: int) -> None:
        """Write an in-memory reply while ~3x its packed size is reserved for ``peer`` (the map, its packed
        bytes, its frames), under :func:`node.p2p.filesend.reply_deadline`; ``busy`` when the budget is full."""
        size = len(pack(reply))
        try:
            async with self.budget.reserve(peer, 3 * size):
                await write_msg(stream, reply, timeout=reply_deadline(size), max_message=limit)
        except Busy as e:
            await write_error(stream, e.code, e.message)

    async def handle(self, stream: MsgStream, peer: str) -> None:
        """Answer one request (module docstring). Every write is under a deadline; a reader that stops reading
        is cut after :data:`node.p2p.filesend.STALL` seconds per frame, giving its reservation back.

        Raises:
            FrameError, StreamClosed, RequestTimeout: from the stream (the host resets it).
        """
        msg = await read_msg(stream, timeout=REQUEST_READ_S, max_message=MAX_REQUEST)
        op = msg.get("op")
        if op == "light":
            await self._reply(stream, peer, await _light_handler_reply(self.store, msg), MAX_REPLY)
            return
        m = self.manifest
        if m is None:
            await write_error(stream, "no_snapshot", "this node has no snapshot yet")
            return
        if op == "offer":
            got = self.offerable()
            if got is None:  # no kept snapshot's next block is stored yet: offer nothing unprovable
                await write_error(stream, "no_snapshot", "the snapshot's next block is not stored yet")
                return
            await self._reply(stream, peer, {"status": "ok", "manifest": got[0].to_wire(), "block": got[1]}, 1 << 24)
            return
        if op == "chunk":
            i, sid = msg.get("index"), msg.get("snapshot")
            want = self.kept.get(sid) if isinstance(sid, bytes) else None
            if want is None or not isinstance(i, int) or not 0 <= i < len(want.chunks):
                await write_error(stream, "not_found", "no such snapshot or chunk here")
                return
            await self._chunk(stream, peer, want, i)
            return
        await write_error(stream, "bad_request", "op is offer, chunk or light")

    async def _chunk(self, stream: MsgStream, peer: str, m: snap.Manifest, i: int) -> None:
        cid = m.chunks[i]
        if self.disk is None:  # in memory: the chunk's bytes are held anyway; reserve its packed copies
            data = self.chunks.get(cid) if m is self.manifest else None
            if data is None:
                await write_error(stream, "not_found", "this chunk is not here")
                return
            await self._reply(stream, peer, {"status": "ok", "data": data}, len(data) + MAX_PREFIX)
            return
        disk = self.disk
        try:
            # the reservation first, then the file: a request waiting for room holds no file descriptor
            async with self.budget.reserve(peer, STREAM_HOLD):
                try:
                    f, size = await trio.to_thread.run_sync(disk.open_chunk, cid)
                except OSError:  # missing or unreadable
                    await write_error(stream, "not_found", "this chunk is not readable here")
                    return
                try:
                    # the reader re-hashes the file as it is read and raises before the last frame if it is
                    # damaged: the peer's stream is reset, never given a whole message of altered bytes
                    await write_file_msg(stream, cast(BinaryIO, f), size, {"status": "ok"},  # (read(n) is all
                                         timeout=reply_deadline(size), stall=self.stall_s)  # it uses)
                except OSError as e:  # damaged on disk (logged by the reader), or unreadable: cut the reply
                    raise StreamClosed(f"chunk {i} not served: {e}") from None
                finally:
                    f.close()
        except Busy as e:
            await write_error(stream, e.code, e.message)


async def _light_handler_reply(store: LedgerStore, msg: dict[str, Any]) -> dict[str, Any]:
    lo, n = msg.get("from"), msg.get("count")
    if not (isinstance(lo, int) and isinstance(n, int) and lo >= 1 and 1 <= n <= LIGHT_BATCH):
        return {"status": "error", "code": "bad_request", "message": f"from >= 1 and 1 <= count <= {LIGHT_BATCH}"}
    blocks = []
    for h in range(lo, min(store.head, lo + n - 1) + 1):
        try:
            blocks.append(light_block(store, h))
        except KeyError:
            break
    return {"status": "ok", "head": store.head, "blocks": blocks}


async def follow_headers(host: SyncHost, peer: str, genesis: Genesis, height: int,
                         timeout: float = 30.0) -> LightClient:
    """A :class:`LightClient` that followed ``peer``'s headers from genesis to ``height``.

    Raises:
        InvalidBlock: a header, commit or validator set that does not verify, a malformed reply, or the peer ran
            out of headers.
    """
    lc = LightClient(genesis)
    while lc.height < height:
        n = min(LIGHT_BATCH, height - lc.height)
        reply = await host.request(peer, SNAPSHOT_PROTOCOL, {"op": "light", "from": lc.height + 1, "count": n},
                                   timeout=timeout, max_message=MAX_REPLY)
        blocks = reply.get("blocks")
        if not isinstance(blocks, list) or not blocks:
            raise InvalidBlock(f"{peer[:16]} has no headers after {lc.height}")
        lc.follow(parse_light_block(b) for b in blocks[:n])
    return lc


def _header(h: Any) -> Header:
    """The header of a block whose body is not sent: its fields type-checked as
    :func:`node.ledger.core.block.decode_block` checks them (the commit over its hash is checked by the caller).

    Raises:
        InvalidBlock: malformed.
    """
    if not (isinstance(h, list) and len(h) in (7, 9) and isinstance(h[0], str) and isinstance(h[1], int)
            and h[1] >= 1 and isinstance(h[3], int)
            and all(isinstance(x, bytes) and len(x) == 32 for x in (h[2], *h[4:]))):
        raise InvalidBlock("malformed header")
    return Header(*h)


def parse_offer(reply: dict[str, Any]) -> tuple[snap.Manifest, Header, Any]:
    """The manifest, header and commit of an offer reply, shapes checked (nothing verified yet).

    Raises:
        SnapshotError: a malformed manifest. InvalidBlock: a malformed block, header or commit.
    """
    if not isinstance(reply, dict):
        raise InvalidBlock("an offer is a map")
    m = snap.Manifest.from_wire(reply.get("manifest"))
    wire = reply.get("block")
    if not isinstance(wire, dict) or not isinstance(wire.get("b"), dict):
        raise InvalidBlock("malformed block in the offer")
    commit = wire.get("c")
    if not isinstance(commit, list):
        raise InvalidBlock("an offer's commit is a list")
    return m, _header(wire["b"].get("h")), commit


async def check_offer(host: SyncHost, peer: str, store: LedgerStore, reply: dict[str, Any], timeout: float,
                      max_chunks: int) -> Offer:
    """An :class:`Offer` of ``peer``'s offer ``reply`` once everything checkable before a chunk is fetched holds:
    shapes, the header's commit (following ``peer``'s headers from genesis when the validator set changes) and
    :func:`node.ledger.snapshot.check_manifest` against that header.

    Raises:
        SnapshotError, InvalidBlock: the offer is malformed or does not check out. Anything ``host.request``
            raises while following headers.
    """
    m, header, commit = parse_offer(reply)
    snap.check_manifest(m, header, store.genesis.domain, max_chunks)  # cheap checks before any signature
    validators: tuple[bytes, ...] | ValidatorSet = store.genesis.validators
    if store.genesis.params.min_validator_bond:  # follow the validator changes from genesis up to the header
        lc = await follow_headers(host, peer, store.genesis, header.height, timeout)
        if lc.header is None or lc.header.hash != header.hash:
            raise InvalidBlock("the offered header is not the chain's header at its height")
        validators = lc.valset
    verify_header(header, commit, validators)
    return Offer(m, header, commit, validators, [peer])


async def _offer(host: SyncHost, peer: str, store: LedgerStore, timeout: float, limits: SyncLimits) -> Offer | None:
    """``peer``'s checked offer, or None: then the peer was penalised (unless it only has no snapshot)."""
    why: str | None = None
    weight = SLOW
    with trio.move_on_after(limits.offer_budget_s) as scope:
        try:
            reply = await host.request(peer, SNAPSHOT_PROTOCOL, {"op": "offer"},
                                       timeout=min(timeout, limits.offer_timeout_s), max_message=limits.max_offer_bytes)
            return await check_offer(host, peer, store, reply, timeout, limits.max_chunks)
        except RemoteError as e:
            if e.code in ("no_snapshot", "busy"):  # an honest answer: nothing to offer, or not now
                log.info("%s has no snapshot to offer now: %s", peer[:16], e)
                return None
            why = f"error reply: {e}"
        except (snap.SnapshotError, InvalidBlock) as e:
            why, weight = str(e), BAD_OFFER
        except Exception as e:  # noqa: BLE001 - whatever a peer's bytes raise must not end the node (finding 3)
            why = f"{type(e).__name__}: {e}"
    if scope.cancelled_caught:
        why = f"no checked offer within {limits.offer_budget_s:.0f} s"
    log.warning("snapshot offer from %s refused: %s", peer[:16], why)
    host.penalize(peer, weight)
    return None


async def gather_offers(host: SyncHost, store: LedgerStore, peers: list[str], timeout: float,
                        limits: SyncLimits) -> list[Offer]:
    """Ask the first ``limits.max_peers`` distinct ``peers`` for offers at once; the checked ones, one per
    manifest (with every peer that offered it), in the order they are tried: highest certified height, then
    most sources, then fewest chunks. Never raises for anything a peer does."""
    asked = list(dict.fromkeys(peers))[:limits.max_peers]
    got: list[Offer] = []

    async def ask(peer: str) -> None:
        o = await _offer(host, peer, store, timeout, limits)
        if o is not None:
            got.append(o)

    async with trio.open_nursery() as nursery:
        for p in asked:
            nursery.start_soon(ask, p)
    by_id: dict[bytes, Offer] = {}
    for o in got:
        if o.manifest.id in by_id:
            by_id[o.manifest.id].sources += o.sources
        else:
            by_id[o.manifest.id] = o
    return sorted(by_id.values(), key=lambda o: (-o.header.height, -len(o.sources), len(o.manifest.chunks)))


async def state_sync(store: LedgerStore, host: SyncHost, peers: list[str], timeout: float = 30.0,
                     limits: SyncLimits | None = None, spool_dir: Path | None = None) -> State | None:
    """Install the best snapshot offered by ``peers`` into the empty ``store``; None when none checks out.

    Args:
        timeout: seconds for one request at most (a source's own budget may cut it shorter).
        limits: :class:`SyncLimits` (default: its defaults).
        spool_dir: where the chunks are written while they are fetched (a ``statesync-*`` directory under it,
            removed afterwards; spools a crash left there are removed first). None: the system's temp dir.

    Raises:
        snapshot.SnapshotError: the store is not empty. OSError: the spool cannot be written (a local disk).
        Nothing a peer sends or does raises here: a failed offer, source or snapshot is penalised and skipped.
    """
    if store.head or store.base:
        raise snap.SnapshotError("state sync installs into an empty ledger only")
    limits = limits or SyncLimits()
    if spool_dir is not None:
        ChunkSpool.clean(spool_dir)
    offers = await gather_offers(host, store, peers, timeout, limits)
    sources: dict[str, Source] = {}
    for o in offers:
        with ChunkSpool(spool_dir) as spool:
            if not await fetch(host, o, sources, limits, timeout, spool):
                continue
            try:
                # in a worker thread: seconds of hashing and LevelDB writes must not stall the node's trio loop
                # (its connections, pings and handlers). Nothing writes the empty store meanwhile (the ledger
                # starts after state sync); a peer's "light" request only reads it (a fresh node has no headers)
                state = await trio.to_thread.run_sync(snap.restore, store, o.manifest, spool, o.header, o.commit,
                                                      o.validators)
            except Exception as e:  # chunks that match a manifest whose entries are not the header's state
                if store.head or store.base:  # installed, then failed: a local fault, not the peers'
                    raise
                log.warning("snapshot of height %d refused: %s: %s", o.manifest.height, type(e).__name__, e)
                for p in o.sources:
                    drop(host, sources.setdefault(p, Source(p)), LYING, "its snapshot is not the header's state")
                continue
        log.info("state synced at height %d from %d peer(s): %d chunks", o.manifest.height, len(o.sources),
                 len(o.manifest.chunks))
        return state
    return None


__all__ = ["BAD_CHUNK", "BAD_OFFER", "LYING", "SLOW", "SNAPSHOT_PROTOCOL", "Offer", "SnapshotServer", "Source",
           "SourceState", "SyncHost", "SyncLimits", "check_offer", "follow_headers", "gather_offers", "parse_offer",
           "state_sync"]


async def sync_or_replay(store: LedgerStore, host: SyncHost, peers: list[str], limits: SyncLimits,
                         spool_dir: Path) -> State | None:
    """``node start --state-sync`` on an empty ledger: the state of a snapshot that a connected peer offers
    (checked against a finalised header; the ledger then follows the chain from the block after it), or None when
    no offer checks out (the node replays from genesis). :func:`state_sync` penalises and skips whatever a peer
    does; this also guards the node against a local failure before anything was installed.

    Raises:
        Exception: a local failure after a snapshot was installed (the store is no longer empty).
    """
    try:
        synced = await state_sync(store, host, peers, limits=limits, spool_dir=spool_dir) if peers else None
    except Exception:
        if store.head or store.base:  # a snapshot was installed, then something local failed
            raise
        log.exception("state sync failed; following the chain from genesis")
        synced = None
    if synced is None:
        log.info("state sync: no usable snapshot from %d peer(s); following the chain from genesis", len(peers))
    else:
        log.info("state synced to height %d from a snapshot; following the chain from block %d",
                 synced.height, synced.height + 1)
    return synced
