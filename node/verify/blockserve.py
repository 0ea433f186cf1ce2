"""Serving the decoder blocks of the models this node holds over ``BLOCK_PROTOCOL`` (``/tally/block/1.0.0``; the
requests and the fetching side are described in :mod:`node.verify.blockfetch`).

Block and head files are streamed from disk one 1 MiB frame at a time (:func:`node.p2p.filesend.serve_file`),
never read whole into memory; manifest, config and tokenizer replies are built in memory with 3x their size
reserved first. Every reply reserves its memory from the node's :class:`~node.p2p.budget.ReplyBudget` (per peer
and node-wide; ``busy`` when full) and is written under a deadline (10 s + 1 s per MiB for the whole reply,
:data:`~node.p2p.filesend.STALL` per frame), so a requester that never reads is cut and gives its budget back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..compute.model import HEAD_FILE, MANIFEST, Manifest, block_file, load_manifest
from ..p2p.budget import ReplyBudget
from ..p2p.filesend import STALL, open_sized, reply_deadline, serve_file, write_error
from ..p2p.framing import RemoteError, read_msg, write_msg
from ..p2p.streams import StreamHandler
from .chunks import CHUNK, BadIndex, file_index, read_range

if TYPE_CHECKING:
    from libp2p.abc import INetStream

BLOCK_PROTOCOL = "/tally/block/1.0.0"
MAX_FILE = 48 << 20  # bytes: the largest block file served or accepted (below the 64 MiB message limit)
MAX_MANIFEST = 1 << 20  # bytes: manifest.json and config.json, each
REQUEST_MAX = 1 << 12  # bytes: a request message
REQUEST_TIMEOUT = 10.0  # seconds a server waits for the request after the stream opens
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model")
MAX_TOKENIZER = 32 << 20  # bytes: all tokenizer files of a reply together


class HeldModels:
    """The model dirs this node can serve blocks from: its own model and what it fetched.

    Args:
        own: the node's model dir (complete). fetched_root: ``<data dir>/models``, where :class:`BlockFetcher`
            writes (each ``<model id hex>/`` may hold only some blocks).
    """

    def __init__(self, own: Path | None, fetched_root: Path):
        self.fetched_root = Path(fetched_root)
        self._own: dict[bytes, Path] = {}
        if own is not None:
            self.add(Path(own))

    def add(self, model_dir: Path) -> Manifest:
        """Serve ``model_dir`` (complete, or partly fetched) too; returns its manifest."""
        m = load_manifest(model_dir)
        self._own[m.model_id] = Path(model_dir)
        return m

    def dir_of(self, model_id: bytes) -> Path | None:
        """The dir holding ``model_id``'s manifest, or None."""
        if model_id in self._own:
            return self._own[model_id]
        d = self.fetched_root / model_id.hex()
        return d if (d / MANIFEST).is_file() else None

    def _resolve(self, msg: dict[str, Any]) -> tuple[str, Path, Path | None]:
        """``(type, model dir, file)`` of a request; ``file`` is the block or head file (None for the small
        replies). Raises RemoteError: ``bad_request``, ``not_found``."""
        mid = msg.get("model_id")
        if not (isinstance(mid, bytes) and len(mid) == 32):
            raise RemoteError("bad_request", "model_id must be 32 bytes")
        kind = msg.get("type")
        if kind not in ("manifest", "block", "head", "tokenizer", "index", "range"):
            raise RemoteError("bad_request", "type is manifest, block, head, tokenizer, index or range")
        path = None
        if kind in ("index", "range"):  # a block (index >= 0) or the head (-1), in checked chunks (verify.chunks)
            i = msg.get("index")
            if not isinstance(i, int) or isinstance(i, bool) or not -1 <= i < 100_000:
                raise RemoteError("bad_request", "index must be a block number, or -1 for the head")
            path = Path(HEAD_FILE if i == -1 else block_file(i))
            if kind == "range":
                o, n = msg.get("offset"), msg.get("length")
                if not (isinstance(o, int) and isinstance(n, int) and not isinstance(o, bool)
                        and not isinstance(n, bool) and o >= 0 and 0 < n <= CHUNK):
                    raise RemoteError("bad_request", f"offset >= 0 and 0 < length <= {CHUNK} required")
        elif kind == "block":
            i = msg.get("index")
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 100_000:
                raise RemoteError("bad_request", "index must be a block number")
            path = Path(block_file(i))
        elif kind == "head":
            path = Path(HEAD_FILE)
        d = self.dir_of(mid)
        if d is None:
            raise RemoteError("not_found", f"model {mid.hex()[:16]} is not held here")
        return kind, d, None if path is None else d / path

    def _small_size(self, kind: str, d: Path) -> int:
        """Bytes of the files a manifest or tokenizer reply carries (blocking). Raises RemoteError ``too_large``."""
        names = (MANIFEST, "config.json") if kind == "manifest" else TOKENIZER_FILES
        total = 0
        for name in names:
            try:
                total += (d / name).stat().st_size
            except OSError:
                continue
        limit = 2 * MAX_MANIFEST if kind == "manifest" else MAX_TOKENIZER
        if total > limit:
            raise RemoteError("too_large", f"{kind} files are {total} bytes, over {limit}")
        return total

    async def _small(self, kind: str, d: Path) -> dict[str, Any]:
        if kind == "manifest":
            return {"manifest": await _read(d / MANIFEST, MAX_MANIFEST), "config": await _read(d / "config.json",
                                                                                              MAX_MANIFEST)}
        files: dict[str, bytes] = {}
        total = 0
        for name in TOKENIZER_FILES:
            if (d / name).is_file():
                files[name] = await _read(d / name, MAX_TOKENIZER)
                total += len(files[name])
        if total > MAX_TOKENIZER:
            raise RemoteError("too_large", f"tokenizer files are {total} bytes, over {MAX_TOKENIZER}")
        return {"files": files}

    async def handle(self, msg: dict[str, Any], peer: str) -> dict[str, Any]:
        """The whole reply to one request, in memory: for :meth:`~node.p2p.host.P2PHost.set_request_handler` in
        tests and tools. A node registers :meth:`stream_handler` instead, which streams block files from disk
        under a budget and write deadlines.

        Raises:
            RemoteError: ``bad_request``, ``not_found``, ``too_large``.
        """
        kind, d, path = self._resolve(msg)
        if kind in ("index", "range"):
            assert path is not None
            return await _chunk_reply(kind, path, msg)
        if path is not None:
            return {"data": await _read(path, MAX_FILE)}
        return await self._small(kind, d)

    def stream_handler(self, budget: ReplyBudget, stall: float = STALL,
                       request_timeout: float = REQUEST_TIMEOUT) -> StreamHandler:
        """The ``BLOCK_PROTOCOL`` stream handler (:meth:`node.p2p.host.P2PHost.set_handler`): reads one request
        (at most :data:`REQUEST_MAX` bytes within ``request_timeout`` seconds) and writes one reply.

        Block and head files are streamed from disk (:func:`~node.p2p.filesend.serve_file`: 2 MiB reserved from
        ``budget``, ``stall`` seconds per frame, 10 s + 1 s per MiB in all); manifest and tokenizer replies
        reserve 3x their size before they are read. ``busy``, ``not_found``, ``too_large`` and ``bad_request``
        are error replies; a malformed request raises FrameError (the host answers ``bad_frame`` and penalises
        the peer); a reply not written in time raises RequestTimeout (the host resets the stream).
        """

        async def serve(stream: INetStream, peer: str) -> None:
            msg = await read_msg(stream, request_timeout, REQUEST_MAX)
            try:
                kind, d, path = self._resolve(msg)
                if path is None:
                    size = await trio.to_thread.run_sync(self._small_size, kind, d)
            except RemoteError as e:
                await write_error(stream, e.code, e.message)
                return
            if kind in ("index", "range"):
                assert path is not None
                try:
                    if kind == "range":
                        hold = msg["length"]
                    else:  # the index is computed (and cached) before its memory is reserved: its real size
                        header, commitments = await _index(path)
                        hold = len(header) + 40 * len(commitments)
                    async with budget.reserve(peer, hold + (1 << 16)):
                        fields = ({"header": header, "commitments": commitments} if kind == "index"
                                  else await _chunk_reply(kind, path, msg))
                        await write_msg(stream, {"status": "ok", **fields}, timeout=reply_deadline(hold),
                                        max_message=hold + (1 << 16))
                except RemoteError as e:  # busy, not_found, bad_request
                    await write_error(stream, e.code, e.message)
                return
            if path is not None:
                await serve_file(stream, peer, path, limit=MAX_FILE, budget=budget, stall=stall)
                return
            try:
                async with budget.reserve(peer, 3 * size + 1024):
                    reply = {"status": "ok", **await self._small(kind, d)}
                    await write_msg(stream, reply, timeout=reply_deadline(size),
                                    max_message=MAX_TOKENIZER + (1 << 16))
            except RemoteError as e:  # busy, or a file that grew past its limit meanwhile
                await write_error(stream, e.code, e.message)

        return serve


async def _chunk_reply(kind: str, path: Path, msg: dict[str, Any]) -> dict[str, Any]:
    """The reply to an ``index`` or ``range`` request for the file at ``path`` (:mod:`node.verify.chunks`).

    Raises:
        RemoteError: ``not_found`` (no such file here), ``bad_request`` (a file that cannot be indexed)."""
    if kind == "index":
        header, commitments = await _index(path)
        return {"header": header, "commitments": commitments}
    try:
        return {"data": await trio.to_thread.run_sync(read_range, path, msg["offset"], msg["length"])}
    except FileNotFoundError:
        raise RemoteError("not_found", f"{path.name} is not held here") from None
    except OSError as e:
        raise RemoteError("bad_request", f"{path.name} cannot be read: {e}") from None


async def _index(path: Path) -> tuple[bytes, dict[str, bytes]]:
    """:func:`file_index` of ``path`` in a thread. Raises RemoteError ``not_found`` / ``bad_request``."""
    try:
        return await trio.to_thread.run_sync(file_index, path)
    except FileNotFoundError:
        raise RemoteError("not_found", f"{path.name} is not held here") from None
    except (OSError, BadIndex, ValueError, KeyError) as e:
        raise RemoteError("bad_request", f"{path.name} cannot be served in chunks: {e}") from None


async def _read(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` (read in a thread). Raises RemoteError: ``not_found``, ``too_large`` (over
    ``limit`` bytes)."""
    def read() -> bytes:
        f, _size = open_sized(path, limit)
        with f:
            data = f.read(limit + 1)
        if len(data) > limit:  # grew since it was sized
            raise RemoteError("too_large", f"{path.name} is over the {limit}-byte limit")
        return data

    return await trio.to_thread.run_sync(read)
