"""Snapshots on disk: content-addressed chunk files and manifests under the node's data dir (the edge of
:mod:`node.ledger.snapshot`).

Layout under ``<data dir>/snapshots/``:
  ``chunks/<chunk id hex>``        the chunk's bytes (:func:`node.ledger.snapshot.chunk_id` of them names the file)
  ``<height, 16 digits>.manifest`` the :class:`node.ledger.snapshot.Manifest` wire form (msgpack)

Every file is written to a temporary name in the same directory, flushed and fsynced, then renamed over its final
name (POSIX ``rename`` is atomic) and the directory fsynced; a snapshot's manifest is written only after all its
chunks, so after a crash at any point a manifest names only chunks that are whole. Temporary files left by a
crash are removed at open. After a new manifest the oldest beyond ``keep`` are deleted, then every chunk no kept
manifest names (chunks shared by two snapshots are stored once). A chunk is re-hashed when read: a file damaged
on disk is never served (:meth:`SnapshotDir.chunk` returns None and logs).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..encoding import DecodeError, pack, unpack
from . import snapshot as snap

log = logging.getLogger(__name__)

KEEP = 2  # snapshots kept on disk by default
_TMP = ".tmp-"


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{_TMP}{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SnapshotDir:
    """The snapshots kept under ``root`` (created when missing). ``keep``: how many snapshots stay (>= 1).

    Raises:
        ValueError: ``keep`` < 1. OSError: the directory cannot be created.
    """

    def __init__(self, root: Path, keep: int = KEEP):
        if keep < 1:
            raise ValueError("keep at least one snapshot")
        self.root, self.keep = Path(root), keep
        self.chunk_dir = self.root / "chunks"
        self.chunk_dir.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.chunk_dir):  # what a crash left half-written
            for p in d.glob(f"{_TMP}*"):
                p.unlink(missing_ok=True)

    def _chunk_path(self, cid: bytes) -> Path:
        return self.chunk_dir / cid.hex()

    def put_chunk(self, cid: bytes, data: bytes) -> None:
        """Store one chunk under its id (kept as is when already there: content-addressed).

        Raises:
            ValueError: ``cid`` is not the id of ``data``. OSError: the disk refused.
        """
        if snap.chunk_id(data) != cid:
            raise ValueError("chunk id does not match its bytes")
        p = self._chunk_path(cid)
        if not p.exists():
            _write_atomic(p, data)

    def write(self, manifest: snap.Manifest) -> None:
        """Record ``manifest`` (after every chunk it names was put), then drop the snapshots beyond ``keep`` and
        the chunks no kept snapshot names.

        Raises:
            ValueError: a chunk of ``manifest`` is not stored. OSError: the disk refused.
        """
        missing = [c.hex()[:16] for c in manifest.chunks if not self._chunk_path(c).exists()]
        if missing:
            raise ValueError(f"snapshot {manifest.height}: chunks not stored: {', '.join(missing[:4])}")
        _fsync_dir(self.chunk_dir)
        _write_atomic(self.root / f"{manifest.height:016d}.manifest", pack(manifest.to_wire()))
        _fsync_dir(self.root)
        self._gc()

    def _manifest_paths(self) -> list[Path]:
        return sorted(self.root.glob("*.manifest"))

    def manifests(self) -> list[snap.Manifest]:
        """The kept snapshots' manifests, oldest first (an unreadable one is skipped and logged)."""
        out = []
        for p in self._manifest_paths():
            try:
                out.append(snap.Manifest.from_wire(unpack(p.read_bytes())))
            except (OSError, DecodeError, snap.SnapshotError) as e:
                log.warning("snapshot manifest %s is unreadable, skipped: %s", p.name, e)
        return out

    def latest(self) -> snap.Manifest | None:
        """The newest kept snapshot whose chunk files are all present, or None."""
        for m in reversed(self.manifests()):
            if all(self._chunk_path(c).exists() for c in m.chunks):
                return m
            log.warning("snapshot of height %d has missing chunk files, skipped", m.height)
        return None

    def chunk(self, cid: bytes) -> bytes | None:
        """The bytes of chunk ``cid`` if stored and intact (re-hashed), else None."""
        try:
            data = self._chunk_path(cid).read_bytes()
        except OSError:
            return None
        if snap.chunk_id(data) != cid:
            log.warning("snapshot chunk %s is damaged on disk; not served", cid.hex()[:16])
            return None
        return data

    def open_chunk(self, cid: bytes) -> tuple[VerifyingReader, int]:
        """Chunk ``cid``'s file opened for streaming (blocking: call in a worker thread), and its size in bytes.
        The reader re-hashes the bytes as they are read (:class:`VerifyingReader`).

        Raises:
            OSError: not stored, or unreadable.
        """
        f = open(self._chunk_path(cid), "rb")  # noqa: SIM115 - the caller closes it
        size = os.fstat(f.fileno()).st_size
        return VerifyingReader(f, cid, size), size

    def _gc(self) -> None:
        paths = self._manifest_paths()
        for p in paths[:-self.keep]:
            p.unlink(missing_ok=True)
        live = {c.hex() for m in self.manifests() for c in m.chunks}
        for p in self.chunk_dir.iterdir():
            if p.name not in live and not p.name.startswith(_TMP):
                p.unlink(missing_ok=True)

    def size_bytes(self) -> int:
        """Bytes of every file kept (manifests and chunks)."""
        return sum(p.stat().st_size for d in (self.root, self.chunk_dir) for p in d.iterdir() if p.is_file())


class VerifyingReader:
    """A chunk file read front to back (``read(n)``) while its bytes are hashed: the read that reaches the end
    raises :class:`OSError` instead of returning them if they are not chunk ``cid`` (damaged on disk). A reply
    streamed from it is cut before its last frame, never completed with altered bytes. ``size``: the file's
    length in bytes."""

    def __init__(self, f: BinaryIO, cid: bytes, size: int):
        self.f, self.cid, self.size = f, cid, size
        self._h = hashlib.blake2b(digest_size=32)  # as node.encoding.H(CHUNK_TAG, bytes), incrementally
        self._h.update(snap.CHUNK_TAG)
        self._read = 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes. Raises: OSError (the file's bytes are not its chunk, or it cannot be read)."""
        data = self.f.read(n)
        self._h.update(data)
        self._read += len(data)
        if self._read >= self.size and self._h.digest() != self.cid:
            log.warning("snapshot chunk %s is damaged on disk; not served", self.cid.hex()[:16])
            raise OSError(f"snapshot chunk {self.cid.hex()[:16]} is damaged on disk")
        return data

    def close(self) -> None:
        self.f.close()


class DiskChunks:
    """``{chunk id: bytes}`` read from a :class:`SnapshotDir` on demand (what :class:`node.ledger.statesync.
    SnapshotServer` serves from): ``[id]`` raises KeyError for a chunk not stored or damaged."""

    def __init__(self, d: SnapshotDir, manifest: snap.Manifest):
        self.dir, self.ids = d, manifest.chunks

    def __getitem__(self, cid: bytes) -> bytes:
        data = self.dir.chunk(cid) if cid in self.ids else None
        if data is None:
            raise KeyError(cid)
        return data

    def get(self, cid: bytes, default: bytes | None = None) -> bytes | None:
        try:
            return self[cid]
        except KeyError:
            return default

    def __len__(self) -> int:
        return len(self.ids)

    def nbytes(self) -> int:
        return sum(self.dir._chunk_path(c).stat().st_size for c in self.ids)


class ChunkSpool:
    """The chunks of one snapshot being downloaded by state sync (:func:`node.ledger.statesync.state_sync`), on
    disk instead of in memory: one file per chunk, put by index in any order, in a fresh directory
    ``statesync-*`` under ``parent`` (the node's data dir; None: the system's temporary directory). Indexable
    like the list of chunk bytes :func:`node.ledger.snapshot.restore` takes, reading one chunk at a time.
    :meth:`close` (or leaving the ``with`` block) removes the directory, after a restore or a failure alike;
    spools a crash left behind are removed by :meth:`clean`. Files are not fsynced: a spool never outlives its
    process's use of it.

    Raises:
        OSError: the directory cannot be created.
    """

    PREFIX = "statesync-"

    def __init__(self, parent: Path | None = None):
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=self.PREFIX, dir=parent))
        self.nbytes = 0  # bytes of every chunk stored
        self._sizes: dict[int, int] = {}  # chunk index -> bytes

    @classmethod
    def clean(cls, parent: Path) -> None:
        """Remove the spools a crashed process left under ``parent`` (none there, or no ``parent``: nothing)."""
        if Path(parent).is_dir():
            for d in Path(parent).glob(f"{cls.PREFIX}*"):
                shutil.rmtree(d, ignore_errors=True)

    def _path(self, i: int) -> Path:
        return self.root / f"{i:08d}"

    def put(self, i: int, data: bytes) -> None:
        """Write chunk ``i``'s bytes (chunks may come in any order; a second put of ``i`` replaces it).

        Raises:
            ValueError: ``i`` < 0. OSError: a full or failing disk.
        """
        if i < 0:
            raise ValueError(f"no chunk {i}")
        old = self._sizes.get(i)
        self._path(i).write_bytes(data)
        self._sizes[i] = len(data)
        self.nbytes += len(data) - (old or 0)

    def __contains__(self, i: object) -> bool:
        return i in self._sizes

    def __len__(self) -> int:
        """Chunks stored."""
        return len(self._sizes)

    def __getitem__(self, i: int) -> bytes:
        """Chunk ``i``'s bytes, read from its file. Raises: IndexError (not stored), OSError."""
        if i not in self._sizes:
            raise IndexError(i)
        return self._path(i).read_bytes()

    def __iter__(self) -> Iterator[bytes]:
        """Chunks 0, 1, ... in order, read one at a time (stops at the first one not stored)."""
        i = 0
        while i in self._sizes:
            yield self[i]
            i += 1

    def close(self) -> None:
        """Remove the spool's directory and every chunk in it (again: nothing)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ChunkSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["KEEP", "ChunkSpool", "DiskChunks", "SnapshotDir", "VerifyingReader"]
