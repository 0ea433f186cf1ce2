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

import logging
import os
from pathlib import Path

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


__all__ = ["KEEP", "DiskChunks", "SnapshotDir"]
