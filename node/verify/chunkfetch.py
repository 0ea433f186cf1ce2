"""Fetching one block or head file in checked, resumable chunks (the protocol is in :mod:`node.verify.chunks`).

:func:`fetch_file` asks the peers in turn for the file's index until one checks against the manifest, then fetches
each tensor's ranges (at most :data:`~node.verify.chunks.CHUNK` bytes a request) from one peer at a time: a peer
that fails a request, times out, or sends bytes whose tensor does not hash to its commitment is dropped for the
rest of the file and the tensor is asked of the next one. Checked tensors are recorded beside the part file, so a
fetch cut short (a crash, a deadline, no peer left) continues where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from ..encoding import DecodeError
from ..p2p.framing import FrameError, RemoteError, RequestTimeout, StreamClosed
from ..p2p.host import PeerUnreachable
from .chunks import CHUNK, MAX_HEADER, MAX_TENSORS, BadIndex, FileIndex, parse_index

# (peer, message, max reply bytes) -> reply: msgpack maps
Request = Callable[[str, dict[str, Any], int], Awaitable[dict[str, Any]]]
# what one request to a peer raises when that peer cannot or will not answer: the next peer is asked
REQUEST_FAILURES = (PeerUnreachable, RemoteError, StreamClosed, FrameError, RequestTimeout, DecodeError)


BUSY_PAUSES = (0.5, 1.0, 2.0)  # seconds waited before asking a peer that answered ``busy`` again


async def _ask(request: Request, peer: str, msg: dict[str, Any], max_message: int) -> dict[str, Any]:
    """``request`` with up to ``len(BUSY_PAUSES)`` retries of a peer whose reply budget is full (``busy``)."""
    for pause in (*BUSY_PAUSES, None):
        try:
            return await request(peer, msg, max_message)
        except RemoteError as e:
            if e.code != "busy" or pause is None:
                raise
            await trio.sleep(pause)
    raise AssertionError("unreachable")


class ChunkFetchFailed(LookupError):
    """No peer returned the file's index or one of its tensors with the right hashes; the message lists why.
    What was checked so far stays in the part file for the next attempt."""


def _progress_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part.json")


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _load_progress(dest: Path, index: FileIndex) -> set[str]:
    """Names of the tensors a previous fetch of this same index checked (none if the index differs)."""
    try:
        doc = json.loads(_progress_path(dest).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(doc, dict) or doc.get("index") != index.digest() or not _part_path(dest).exists():
        return set()
    done = doc.get("done")
    return {n for n in done if isinstance(n, str)} if isinstance(done, list) else set()


def _save_progress(dest: Path, index: FileIndex, done: set[str]) -> None:
    tmp = _progress_path(dest).with_suffix(".tmp")
    tmp.write_text(json.dumps({"index": index.digest(), "done": sorted(done)}))
    os.replace(tmp, _progress_path(dest))


async def fetch_file(request: Request, peers: list[str], model_id: bytes, index: int, expected: bytes,
                     dest: Path, max_size: int, install: Callable[[Path, Path], None],
                     refused: Callable[[str, str], None] = lambda _p, _w: None) -> int:
    """Fetch block ``index`` of ``model_id`` (``-1``: the head) into ``dest``; returns the bytes fetched now.

    Args:
        request: sends one request to a peer and returns its reply (raises the host's request errors).
        expected: the manifest's hash of the file. max_size: bytes the file may take (from the model's config).
        install: ``install(part, dest)`` checks the finished part file whole and moves it into place (blocking;
            raises ValueError).
        refused: called with ``(peer, why)`` for each reply that failed a check.

    Raises:
        ChunkFetchFailed: no index or tensor could be had with the right hashes from any peer.
    """
    what = "the head" if index == -1 else f"block {index}"
    errors: list[str] = []
    live = list(peers)
    idx = None
    for peer in list(live):
        try:
            reply = await _ask(request, peer, {"type": "index", "model_id": model_id, "index": index},
                               MAX_HEADER + 40 * MAX_TENSORS + (1 << 16))
            idx = parse_index(reply.get("header"), reply.get("commitments"), expected, max_size)
            break
        except REQUEST_FAILURES as e:
            errors.append(f"{peer[:16]}: {type(e).__name__}: {e}")
        except BadIndex as e:
            refused(peer, f"index of {what}: {e}")
            errors.append(f"{peer[:16]}: refused index: {e}")
        live.remove(peer)
    if idx is None:
        raise ChunkFetchFailed(f"no checked index of {what}: {'; '.join(errors[-8:]) or 'no peer'}")
    part = _part_path(dest)
    done = await trio.to_thread.run_sync(_load_progress, dest, idx)
    fetched = 0
    mode = "r+b" if done else "w+b"
    with open(part, mode) as f:
        f.truncate(idx.size)
        os.pwrite(f.fileno(), idx.header, 0)
        for t in idx.tensors:
            if t.name in done:
                continue
            while True:
                if not live:
                    raise ChunkFetchFailed(f"tensor {t.name} of {what}: no peer left: {'; '.join(errors[-8:])}")
                peer = live[0]
                h, at, ok = t.hasher(), t.start, True
                while at < t.end:
                    n = min(CHUNK, t.end - at)
                    try:
                        reply = await _ask(request, peer, {"type": "range", "model_id": model_id, "index": index,
                                                           "offset": at, "length": n}, n + (1 << 16))
                    except REQUEST_FAILURES as e:
                        errors.append(f"{peer[:16]}: {type(e).__name__}: {e}")
                        ok = False
                        break
                    data = reply.get("data")
                    if not isinstance(data, bytes) or len(data) != n:
                        refused(peer, f"range {at}+{n} of {what}: wrong length")
                        errors.append(f"{peer[:16]}: range of the wrong length")
                        ok = False
                        break
                    h.update(data)
                    await trio.to_thread.run_sync(os.pwrite, f.fileno(), data, at)
                    fetched += n
                    at += n
                if ok and h.digest() != idx.commitments[t.name]:
                    refused(peer, f"tensor {t.name} of {what}: its bytes do not hash to the commitment")
                    errors.append(f"{peer[:16]}: tensor {t.name} failed its hash")
                    ok = False
                if ok:
                    done.add(t.name)
                    await trio.to_thread.run_sync(_save_progress, dest, idx, done)
                    break
                live.remove(peer)  # a peer that failed once is not asked for the rest of this file
        f.flush()
        os.fsync(f.fileno())
    try:
        await trio.to_thread.run_sync(install, part, dest)
    except ValueError as e:  # every tensor checked and still the whole differs: start over next time
        part.unlink(missing_ok=True)
        raise ChunkFetchFailed(f"{what} failed its final check: {e}") from None
    finally:
        _progress_path(dest).unlink(missing_ok=True)
    return fetched
