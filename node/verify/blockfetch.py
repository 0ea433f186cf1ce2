"""Fetching the decoder blocks of a model this node lacks, by content hash, from peers that hold it.

A committee member drawn for a receipt of another model than its own (several models share one swarm) needs that
receipt's span: it asks peers over ``BLOCK_PROTOCOL`` (``/tally/block/1.0.0``, one request per stream) for

* ``{"type": "manifest", "model_id": 32 B}`` → ``{"manifest": bytes, "config": bytes}``: the model's
  ``manifest.json`` and ``config.json``. They are accepted only when :func:`node.compute.model.load_manifest`
  passes on them (``config_hash`` is the hash of that config, ``model_id`` the Merkle root of the listed head,
  block and config hashes) **and** the model id is the one asked for: a peer cannot substitute another model.
* ``{"type": "block", "model_id": 32 B, "index": i}`` → ``{"data": bytes}``: ``block_<i>.safetensors``. The bytes
  are parsed with ``safetensors`` (never pickle, never ``torch.load``) and accepted only when their
  :func:`~node.compute.model.tensors_hash` is ``block_hashes[i]`` of the checked manifest.

* ``{"type": "head", "model_id": 32 B}`` → ``{"data": bytes}``: ``head.safetensors`` (embeddings, final norm, LM
  head), accepted only when it hashes to the manifest's ``head_hash``.
* ``{"type": "tokenizer", "model_id": 32 B}`` → ``{"files": {name: bytes}}``: the tokenizer files the peer holds
  (:data:`TOKENIZER_FILES`). They are checked by hash when the model's config commits to them, else kept marked
  as a peer's and never trusted (:mod:`node.verify.tokfetch`).

:meth:`BlockFetcher.ensure` brings a span's blocks (inference receipts); :meth:`BlockFetcher.ensure_model` the whole
model — every block, the head and the tokenizer — for replaying training receipts of jobs and runs.

Errors: ``not_found`` (the peer does not hold that model or block), ``too_large`` (over :data:`MAX_FILE`),
``bad_request``, ``busy`` (the server's reply budget is full: :mod:`node.p2p.budget`). A reply that fails a check
is dropped and the next peer is asked; peers that were busy are asked again after a pause (:data:`BUSY_ROUNDS`);
each request is bounded by a timeout (seconds) and a message size.

Serving (:meth:`HeldModels.stream_handler` in :mod:`node.verify.blockserve`, what a node registers): block and
head files are streamed from disk one 1 MiB frame at a time, never read whole into memory, under the node's reply
budget and write deadlines. Fetching: block and head files are written to a part file as their frames arrive
(:func:`node.p2p.filerecv.read_file_msg`), checked from disk and moved into place: a fetch holds one frame of the
file while it arrives (then its tensors once, to hash them), not three copies of it.

Checked files go to ``<root>/<model id hex>/`` (temp file, then ``os.replace``), a directory apart from the model
cache: it may hold only some blocks, and nothing there is used without :class:`~node.compute.span.SpanModel`
checking each block's hash again when it loads it.

If no peer returns a checked copy, :meth:`BlockFetcher.ensure` raises :class:`BlockUnavailable` and the member
abstains (:mod:`node.verify.member`).

Bounds (issue 24, finding 4: the ledger accepts a receipt for any model id, so a receipt for an invented model
must not make committees download without limit):

* **Who serves it**: nothing is fetched for a model that fewer than ``min_servers`` bonded peers announce
  (:meth:`BlockFetcher.servers`: distinct peers of the swarm table's live announcements whose account holds at
  least ``min_bond``; the genesis parameter ``min_model_servers``). Peers named only by the receipt (its worker)
  are asked for bytes once the model passes, but never count toward it. A model nobody serves raises
  :class:`FetchRefused` before any request or write: the member abstains and ``<data dir>/models`` is untouched.
* **Bytes**: per model and in total, with least-recently-used eviction of other fetched models and never the
  node's own (:class:`~node.verify.fetchstore.FetchedModels`); each file is read under the room reserved for it.
* **Time**: one deadline for a whole :meth:`~BlockFetcher.ensure` / :meth:`~BlockFetcher.ensure_model`
  (``deadline`` seconds, lock waits included) besides each request's timeout.
* **Locks**: one per model; fetches of two models run side by side.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio
from libp2p.exceptions import BaseLibp2pError

from ..compute.budget import block_bytes
from ..compute.model import HEAD_FILE, MANIFEST, Manifest, ManifestError, block_file, load_manifest
from ..p2p.filerecv import read_file_msg
from ..p2p.framing import RemoteError, RequestTimeout, StreamClosed, check_reply, write_msg
from .blockcheck import check_block_file
from .blockserve import (
    BLOCK_PROTOCOL,
    MAX_FILE,
    MAX_MANIFEST,
    MAX_TOKENIZER,
    REQUEST_MAX,
    REQUEST_TIMEOUT,
    TOKENIZER_FILES,
    HeldModels,
)
from .chunkfetch import REQUEST_FAILURES, ChunkFetchFailed, fetch_file
from .chunks import MAX_HEADER
from .fetchstore import MAX_MODEL_BYTES, MAX_TOTAL_BYTES, FetchedModels, OverCap, bonded_peers
from .tokfetch import (
    TOKENIZER_ASKED,
    UNVERIFIED_TOKENIZER,
    check_tokenizer,
    committed_tokenizer,
    install_tokenizer,
    tokenizer_trusted,
)

if TYPE_CHECKING:
    from libp2p.abc import INetStream

    from ..p2p.host import P2PHost

__all__ = ["BLOCK_PROTOCOL", "FETCH_DEADLINE", "FETCH_TIMEOUT", "MAX_FILE", "MAX_MANIFEST", "MAX_TOKENIZER",
           "REQUEST_MAX", "REQUEST_TIMEOUT", "TOKENIZER_FILES", "UNVERIFIED_TOKENIZER", "BlockFetcher",
           "BlockUnavailable", "FetchRefused", "HeldModels", "bonded_peers", "tokenizer_trusted"]

log = logging.getLogger("tally.blockfetch")

FETCH_TIMEOUT = 60.0  # seconds per request (a 48 MiB block over a slow link)
FETCH_DEADLINE = 600.0  # seconds for one ensure / ensure_model: SmolLM2-135M (~540 MB) at ~1 MB/s
BUSY_ROUNDS = 3  # times the peers that answered ``busy`` are asked again, after BUSY_PAUSE, 2*BUSY_PAUSE, ...
BUSY_PAUSE = 1.0  # seconds
MAX_PEERS = 8  # peers asked per file before giving up
PARALLEL = 4  # blocks fetched at once


class BlockUnavailable(LookupError):
    """No peer returned a copy of a model's manifest or block that matches its hash."""


class FetchRefused(BlockUnavailable):
    """This node will not fetch (more of) that model: too few bonded servers announce it, a byte cap would be
    passed, or the fetch's deadline passed."""


_T = TypeVar("_T")


class BlockFetcher:
    """Brings the blocks of a span of another model into ``root/<model id hex>/``, checked against the model id.

    Args:
        host: :class:`~node.p2p.host.P2PHost`. root: the fetched-models dir (``<data dir>/models``).
        holders: ``holders(model_id, block) -> [peer id, ...]``: peers that announce that block of that model
            (``block`` -1: any block), e.g. from the swarm table.
        timeout: seconds per request. max_peers: peers tried per file.
        bonded: ``bonded(peer id) -> bool`` (:func:`bonded_peers`); None counts every announcing peer (tests and
            tools without a ledger). min_servers: distinct (bonded) announcing peers a model needs before anything
            of it is fetched (genesis ``min_model_servers``).
        max_model_bytes, max_total_bytes: byte caps of one fetched model and of all of them
            (:class:`~node.verify.fetchstore.FetchedModels`). keep: model ids never evicted (the node's own).
        deadline: seconds one :meth:`ensure` or :meth:`ensure_model` may take in all.
    """

    def __init__(self, host: P2PHost, root: Path, holders: Callable[[bytes, int], list[str]],
                 timeout: float = FETCH_TIMEOUT, max_peers: int = MAX_PEERS, *,
                 bonded: Callable[[str], bool] | None = None, min_servers: int = 1,
                 max_model_bytes: int = MAX_MODEL_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES,
                 keep: Iterable[bytes] = (), deadline: float = FETCH_DEADLINE):
        if min_servers < 1:
            raise ValueError("min_servers must be at least 1")
        self.host, self.root, self.holders = host, Path(root), holders
        self.timeout, self.max_peers = timeout, max_peers
        self.bonded, self.min_servers, self.deadline = bonded, min_servers, deadline
        self.store = FetchedModels(self.root, max_model_bytes, max_total_bytes, keep)
        self.refused: deque[tuple[str, str]] = deque(maxlen=256)  # (peer, why): the newest replies that failed

    def servers(self, model_id: bytes) -> list[str]:
        """Distinct peers (not this node) with a live announcement of ``model_id`` whose account is bonded."""
        me = getattr(self.host, "peer_id", None)
        out: list[str] = []
        for p in self.holders(model_id, -1):
            if p != me and p not in out and (self.bonded is None or self.bonded(p)):
                out.append(p)
        return out

    def _gate(self, model_id: bytes) -> None:
        """Raise :class:`FetchRefused` unless at least ``min_servers`` bonded peers announce ``model_id``."""
        n = len(self.servers(model_id))
        if n < self.min_servers:
            raise FetchRefused(f"model {model_id.hex()[:16]} is announced by {n} bonded server(s), fewer than the "
                               f"{self.min_servers} this chain requires before a member fetches it")

    async def _bounded(self, model_id: bytes, what: str, fn: Callable[[], Awaitable[_T]]) -> _T:
        """``await fn()`` under ``model_id``'s lock and within :attr:`deadline` seconds (the wait for the lock
        included); then the model is marked used (LRU).

        Raises:
            FetchRefused: past the deadline, or over a byte cap. BlockUnavailable: as ``fn``.
        """
        with trio.move_on_after(self.deadline):
            async with self.store.lock(model_id):
                try:
                    out = await fn()
                except OverCap as e:
                    raise FetchRefused(f"{what}: {e}") from None
                await trio.to_thread.run_sync(self.store.touch, model_id)
                return out
        raise FetchRefused(f"{what}: not done within the {self.deadline:.0f} s deadline")

    def _candidates(self, model_id: bytes, block: int, extra: Iterable[str]) -> list[str]:
        me = getattr(self.host, "peer_id", None)
        out: list[str] = []
        for p in [*self.holders(model_id, block), *extra]:
            if p not in out and p != me:
                out.append(p)
        return out[:self.max_peers]

    async def _ask(self, peers: list[str], msg: dict[str, Any], accept: Callable[[dict[str, Any]], Awaitable[_T]],
                   what: str, to_file: Path | None = None, max_size: int = MAX_FILE) -> _T:
        """``accept(reply)`` of the first peer whose reply passes it. Peers that answer ``busy`` (their reply
        budget is full) are asked again after the others, up to :data:`BUSY_ROUNDS` more times, pausing
        :data:`BUSY_PAUSE` seconds, then twice that, and so on. ``to_file``: the reply's ``data`` is written
        there as it arrives (:meth:`_fetch_file`, at most ``max_size`` bytes; the reply holds its size) and
        removed when no reply passes. Raises BlockUnavailable."""
        errors: list[str] = []
        try:
            for attempt in range(BUSY_ROUNDS + 1):
                busy: list[str] = []
                for peer in peers:
                    try:
                        if to_file is not None:
                            reply = await self._fetch_file(peer, msg, to_file, max_size)
                        else:
                            reply = await self.host.request(peer, BLOCK_PROTOCOL, msg, timeout=self.timeout,
                                                            max_message=MAX_FILE + (1 << 16))
                    except REQUEST_FAILURES as e:
                        # unreachable, timeout, not_found, too large, malformed: ask the next peer
                        errors.append(f"{peer[:16]}: {type(e).__name__}: {e}")
                        if isinstance(e, RemoteError) and e.code == "busy":
                            busy.append(peer)
                        continue
                    try:
                        return await accept(reply)
                    except (ValueError, TypeError) as e:
                        log.warning("refused %s from %s: %s", what, peer[:16], e)
                        self.refused.append((peer, f"{what}: {e}"))
                        errors.append(f"{peer[:16]}: refused: {e}")
                if not busy or attempt == BUSY_ROUNDS:
                    break
                await trio.sleep(BUSY_PAUSE * 2 ** attempt)
                peers = busy
        finally:
            if to_file is not None:
                to_file.unlink(missing_ok=True)  # accepted files were moved into place
        raise BlockUnavailable(f"{what} unavailable: {'; '.join(errors[-2 * MAX_PEERS:]) or 'no peer holds it'}")

    async def _fetch_file(self, peer: str, msg: dict[str, Any], dest: Path,
                          max_size: int = MAX_FILE) -> dict[str, Any]:
        """Send ``msg`` to ``peer`` and write the reply's ``data`` to ``dest`` as its frames arrive
        (:func:`node.p2p.filerecv.read_file_msg`: at most ``max_size`` bytes, one frame in memory at a time);
        the whole exchange within the fetch timeout. Returns the reply (``data``: its size in bytes).

        Raises:
            PeerUnreachable, RemoteError, StreamClosed, FrameError, RequestTimeout: as
            :meth:`node.p2p.host.P2PHost.request`.
        """
        stream = None
        try:
            with trio.fail_after(self.timeout):
                stream = await self.host.open_stream(peer, BLOCK_PROTOCOL, timeout=self.timeout)
                await write_msg(stream, msg, timeout=self.timeout)
                with open(dest, "wb") as f:
                    reply = await read_file_msg(stream, f, max_size=min(max_size, MAX_FILE),
                                                timeout=self.timeout)
        except trio.TooSlowError:
            await _reset(stream)
            raise RequestTimeout(f"{BLOCK_PROTOCOL} to {peer}: no reply within {self.timeout} s") from None
        except BaseException:
            await _reset(stream)
            raise
        with trio.move_on_after(1.0):
            with contextlib.suppress(StreamClosed, OSError, RuntimeError, BaseLibp2pError):
                await stream.close()
        return check_reply(reply)

    async def manifest(self, model_id: bytes, extra: Iterable[str] = ()) -> Manifest:
        """The checked manifest of ``model_id`` (fetched once, then read from ``root``). Only a model that enough
        bonded servers announce is asked for (:meth:`servers`); callers hold the model's lock.

        Raises:
            FetchRefused: too few bonded servers announce the model, or its cap is reached.
            BlockUnavailable: no peer sent a manifest and config that hash to ``model_id``.
        """
        d = self.root / model_id.hex()
        if (d / MANIFEST).is_file():
            try:
                m = load_manifest(d)
            except (ManifestError, OSError):
                m = None
            if m is not None and m.model_id == model_id:
                return m
        self._gate(model_id)

        async def accept(reply: dict[str, Any]) -> Manifest:
            man, cfg = reply.get("manifest"), reply.get("config")
            if not (isinstance(man, bytes) and isinstance(cfg, bytes)) or max(len(man), len(cfg)) > MAX_MANIFEST:
                raise ValueError("manifest and config must be bytes under 1 MiB")
            return await trio.to_thread.run_sync(self._install_manifest, model_id, man, cfg)

        async with self.store.reserve(model_id, 2 * MAX_MANIFEST):
            return await self._ask(self._candidates(model_id, -1, extra), {"type": "manifest", "model_id": model_id},
                                   accept, f"manifest of model {model_id.hex()[:16]}")

    def _install_manifest(self, model_id: bytes, man: bytes, cfg: bytes) -> Manifest:
        """Check ``manifest.json`` + ``config.json`` in a temp dir (load_manifest) and rename it into place."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{model_id.hex()[:16]}.tmp-", dir=self.root))
        try:
            try:
                json.loads(man)
                (tmp / UNVERIFIED_TOKENIZER).write_text("fetched: no tokenizer checked yet\n")  # born untrusted
                (tmp / "config.json").write_bytes(cfg)
                (tmp / MANIFEST).write_bytes(man)
                m = load_manifest(tmp)
            except (ManifestError, ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"bad manifest: {e}") from None
            if m.model_id != model_id:
                raise ValueError(f"manifest of model {m.model_id.hex()[:16]}, not {model_id.hex()[:16]}")
            target = self.root / model_id.hex()
            if not (target / MANIFEST).is_file():
                if target.exists():
                    shutil.rmtree(target)
                os.rename(tmp, target)
            return load_manifest(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    async def ensure(self, model_id: bytes, start: int, end: int, extra: Iterable[str] = ()) -> Path:
        """The dir of ``model_id`` holding at least blocks ``[start, end)``, each checked against its hash.

        Args:
            extra: peers to ask after the announced holders (e.g. the receipt's worker; they do not count as
                servers of the model).

        Raises:
            FetchRefused: too few bonded servers announce the model (nothing was asked or written), a byte cap
                would be passed, or the deadline passed.
            BlockUnavailable: the manifest or a block could not be had from any peer with the right hash.
            ValueError: ``[start, end)`` is not a span of that model.
        """
        extra = list(extra)
        return await self._bounded(model_id, f"blocks of model {model_id.hex()[:16]}",
                                   lambda: self._ensure_span(model_id, start, end, extra))

    async def _ensure_span(self, model_id: bytes, start: int, end: int, extra: list[str]) -> Path:
        """:meth:`ensure` under the model's lock."""
        m = await self.manifest(model_id, extra)
        if not (0 <= start < end <= m.num_blocks):
            raise ValueError(f"span [{start}, {end}) is not inside model {model_id.hex()[:16]} "
                             f"of {m.num_blocks} blocks")
        d = self.root / model_id.hex()
        missing = [i for i in range(start, end) if not (d / block_file(i)).is_file()]
        if not missing:
            return d
        self._gate(model_id)
        errors: list[BaseException] = []
        limit = trio.CapacityLimiter(PARALLEL)
        async with trio.open_nursery() as n:
            for i in missing:
                n.start_soon(self._block, m, d, i, extra, limit, errors)
        if errors:
            raise errors[0]
        return d

    async def ensure_model(self, model_id: bytes, extra: Iterable[str] = ()) -> Path:
        """The dir of ``model_id`` with every block and the head, each checked against the model id, and the
        tokenizer files a holder sent: checked by hash when the model's config commits to them, else marked as a
        peer's (:mod:`node.verify.tokfetch`, :func:`tokenizer_trusted`).

        Raises:
            FetchRefused: as :meth:`ensure`.
            BlockUnavailable: the manifest, a block or the head could not be had from any peer with its hash.
        """
        extra = list(extra)
        return await self._bounded(model_id, f"model {model_id.hex()[:16]}",
                                   lambda: self._ensure_whole(model_id, extra))

    async def _ensure_whole(self, model_id: bytes, extra: list[str]) -> Path:
        """:meth:`ensure_model` under the model's lock."""
        m = await self.manifest(model_id, extra)
        d = await self._ensure_span(model_id, 0, m.num_blocks, extra)
        if not (d / HEAD_FILE).is_file():
            self._gate(model_id)
            part = d / f"{HEAD_FILE}.part{os.getpid()}"

            async def accept_head(reply: dict[str, Any]) -> None:
                if not isinstance(reply.get("data"), int):
                    raise ValueError("the reply holds no head file")
                await trio.to_thread.run_sync(self._install_part, part, d / HEAD_FILE, m.head_hash)

            async with self.store.reserve(model_id, MAX_FILE) as room:
                await self._ask(self._candidates(model_id, -1, extra), {"type": "head", "model_id": model_id},
                                accept_head, f"head of model {model_id.hex()[:16]}", to_file=part, max_size=room)
        if not (d / TOKENIZER_ASKED).exists():
            self._gate(model_id)
            committed = committed_tokenizer(d)  # the config is covered by the model id
            if committed is None:
                (d / UNVERIFIED_TOKENIZER).write_text("no tokenizer commitment in the model's config\n")

            async def accept_tok(reply: dict[str, Any]) -> None:
                files = reply.get("files")
                if not (isinstance(files, dict) and set(files) <= set(TOKENIZER_FILES)
                        and all(isinstance(v, bytes) for v in files.values())
                        and sum(len(v) for v in files.values()) <= room):
                    raise ValueError(f"tokenizer files must be bytes named among {TOKENIZER_FILES}, {room} "
                                     "bytes at most")
                if committed is not None:
                    check_tokenizer(files, committed)  # raises ValueError: the next peer is asked
                await trio.to_thread.run_sync(install_tokenizer, d, files, committed is not None)

            async with self.store.reserve(model_id, MAX_TOKENIZER) as room:
                try:
                    await self._ask(self._candidates(model_id, -1, extra), {"type": "tokenizer",
                                                                            "model_id": model_id},
                                    accept_tok, f"tokenizer of model {model_id.hex()[:16]}")
                except BlockUnavailable as e:  # replay then tokenizes bytes, and abstains on a mismatch
                    log.info("%s; the dir stays without one", e)
                    (d / UNVERIFIED_TOKENIZER).write_text("no peer sent a tokenizer\n")
            (d / TOKENIZER_ASKED).touch()
        return d

    @staticmethod
    def _install_part(part: Path, path: Path, expected: bytes) -> None:
        """Check the fetched safetensors file ``part`` against ``expected`` (:func:`check_block_file`; raises
        ValueError) and move it to ``path`` (``os.replace``: a reader never sees half a file)."""
        check_block_file(part, expected)
        os.replace(part, path)

    async def _block(self, m: Manifest, d: Path, i: int, extra: list[str], limit: trio.CapacityLimiter,
                     errors: list[BaseException]) -> None:
        """Fetch block ``i`` into ``d`` (checked against ``m.block_hashes[i]``, read under the room reserved for
        it); a failure (:class:`BlockUnavailable`, :class:`~node.verify.fetchstore.OverCap`) goes to ``errors``.

        In checked, resumable chunks first (:mod:`node.verify.chunkfetch`: any size the model's config allows);
        a block that way fails and that fits one reply (:data:`MAX_FILE`) is then asked for whole, as peers that
        predate chunks serve it."""
        path = d / block_file(i)
        part = d / f"{path.name}.part{os.getpid()}"

        async def accept(reply: dict[str, Any]) -> None:
            if not isinstance(reply.get("data"), int):
                raise ValueError("the reply holds no block file")
            await trio.to_thread.run_sync(self._install_part, part, path, m.block_hashes[i])

        async with limit:
            if errors:  # one block failed: the span cannot be had, fetch no more of it
                return
            try:
                peers = self._candidates(m.model_id, i, extra)
                bound = await trio.to_thread.run_sync(self._file_bound, d)
                async with self.store.reserve(m.model_id, bound) as room:
                    try:
                        got = await fetch_file(self._request, peers, m.model_id, i, m.block_hashes[i], path,
                                               min(room, bound),
                                               lambda part_, dest: self._install_part(part_, dest,
                                                                                      m.block_hashes[i]),
                                               lambda p, why: self.refused.append((p, why)))
                        log.info("fetched block %d of model %s in checked chunks (%d bytes now)", i,
                                 m.model_id.hex()[:16], got)
                        return
                    except ChunkFetchFailed as e:
                        log.info("block %d of model %s in chunks: %s; asking for it whole", i,
                                 m.model_id.hex()[:16], e)
                    try:
                        await self._ask(peers, {"type": "block", "model_id": m.model_id, "index": i}, accept,
                                        f"block {i} of model {m.model_id.hex()[:16]}", to_file=part,
                                        max_size=min(room, MAX_FILE))
                    except BlockUnavailable as e:
                        if room < MAX_FILE:  # the model's cap left less room than a block may take
                            raise FetchRefused(f"{e} (the model's byte cap left {room} bytes)") from None
                        raise
            except (BlockUnavailable, OverCap) as e:
                errors.append(e)
                return
        log.info("fetched block %d of model %s (checked against its hash)", i, m.model_id.hex()[:16])

    async def _request(self, peer: str, msg: dict[str, Any], max_message: int) -> dict[str, Any]:
        """One ``BLOCK_PROTOCOL`` request to ``peer`` within the request timeout (raises as ``host.request``)."""
        return await self.host.request(peer, BLOCK_PROTOCOL, msg, timeout=self.timeout, max_message=max_message)

    @staticmethod
    def _file_bound(d: Path) -> int:
        """Bytes a block file of the model in ``d`` may take: its float32 size (no stored form is larger) plus a
        header."""
        return block_bytes(d) + MAX_HEADER + 8


async def _reset(stream: INetStream | None) -> None:
    """Reset ``stream`` (None: nothing), shielded and within 1 s, whatever it raises."""
    if stream is None:
        return
    with (trio.CancelScope(shield=True), trio.move_on_after(1.0),
          contextlib.suppress(StreamClosed, OSError, RuntimeError, BaseLibp2pError)):
        await stream.reset()
