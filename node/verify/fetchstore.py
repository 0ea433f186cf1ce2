"""The fetched-models dir (``<data dir>/models``) under byte caps, with least-recently-used eviction and one lock
per model: what :class:`~node.verify.blockfetch.BlockFetcher` writes into.

A committee member drawn for a receipt of a model it does not hold fetches that model's blocks from peers
(:mod:`node.verify.blockfetch`). Without bounds, receipts naming many models would fill the disk and one slow
fetch would hold every other one back (issue 24, finding 4). Here:

* **Per model**: a model's files together (blocks, head, manifest, config, tokenizer, and the part files of
  fetches in flight) stay within ``max_model_bytes``. Every file fetch first *reserves* the most it may write
  (:meth:`FetchedModels.reserve`: at most ``unit`` bytes, less when the model's cap leaves less; that amount is the
  size limit the reply is read under), and gives back what it did not use once the file is in place.
* **In total**: fetched models together stay within ``max_total_bytes``. A reservation that does not fit first
  evicts whole fetched models, least recently used first (the mtime of a dir's ``.used`` file, touched at each
  use; it survives a restart), never a model in ``keep`` (the node's own) nor one whose lock is held (being
  fetched or read right now). When nothing more can be evicted the reservation fails (:class:`OverCap`).
* **One lock per model** (:meth:`FetchedModels.lock`): two receipts of one model fetch it once, and a fetch of one
  model never waits for another model's. Locks are dropped when nobody holds or waits for them, so the table
  holds at most one entry per fetch in progress.

Sizes are counted from the files on disk (:meth:`FetchedModels.scan`, once at the first use, then kept up to date
by every reservation and install); stale part files and temp dirs left by a crash are removed by that scan.
The caps are the node operator's, not consensus: they bound this node's disk, nothing on the ledger depends on
them.

Design reference: LRU eviction as in any cache of bounded size (e.g. the Linux page cache's inactive list);
reservations before writes as in :mod:`node.p2p.budget`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ..identity import account_from_str

log = logging.getLogger("tally.fetchstore")

MAX_MODEL_BYTES = 1 << 30  # bytes per fetched model: SmolLM2-135M is ~540 MB in float32 (~150 MB int8)
MAX_TOTAL_BYTES = 4 << 30  # bytes of all fetched models together: four models of that size
USED_FILE = ".used"  # touched at each use of a fetched model dir: its mtime orders eviction (oldest first)
TEMP_MARKERS = (".part", ".tmp")  # names of files/dirs being written: removed by the first scan


class OverCap(LookupError):
    """A fetch would take a model or the fetched-models dir past its byte cap (nothing evictable is left)."""


def bonded_peers(state: Callable[[], object]) -> Callable[[str], bool]:
    """``bonded(peer id) -> bool`` over the ledger state ``state()`` returns (a
    :class:`~node.ledger.core.state.State`): whether the peer's account holds at least ``min_bond``. Who may count
    as a server of a model before a committee member fetches it (:meth:`node.verify.blockfetch.BlockFetcher.servers`).
    """
    def bonded(peer: str) -> bool:
        try:
            account = account_from_str(peer)
        except ValueError:
            return False
        s = state()
        return bool(s.account(account).bond >= s.params.min_bond)  # type: ignore[attr-defined]

    return bonded


def _dir_bytes(d: Path) -> int:
    """Bytes of the regular files directly in ``d`` (fetched model dirs are flat); 0 when ``d`` is gone."""
    total = 0
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        return 0
    return total


class FetchedModels:
    """Byte accounting, LRU eviction and per-model locks of a fetched-models dir.

    Args:
        root: the dir (``<data dir>/models``); created only when the first file is written into it.
        max_model_bytes: cap of one model's files (bytes). max_total_bytes: cap of all of them (bytes).
        keep: model ids never evicted (the node's own model, should it live under ``root``).
    """

    def __init__(self, root: Path, max_model_bytes: int = MAX_MODEL_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES,
                 keep: Iterable[bytes] = ()):
        if not 0 < max_model_bytes <= max_total_bytes:
            raise ValueError("need 0 < max_model_bytes <= max_total_bytes")
        self.root = Path(root)
        self.max_model_bytes, self.max_total_bytes = max_model_bytes, max_total_bytes
        self.keep = {bytes(k).hex() for k in keep}
        self._bytes: dict[str, int] | None = None  # model id hex -> bytes on disk (None: not scanned yet)
        self._reserved: dict[str, int] = {}  # model id hex -> bytes reserved by fetches in flight
        self._locks: dict[str, trio.Lock] = {}
        self._changed = trio.Condition()
        self._scanning = trio.Lock()  # one scan: a second one could remove a temp dir the first fetch is writing
        self.evicted: list[str] = []  # model ids (hex) evicted, newest last (at most 64 kept, for logs and tests)

    # ------------------------------------------------------------ locks

    @asynccontextmanager
    async def lock(self, model_id: bytes) -> AsyncIterator[None]:
        """Hold ``model_id``'s lock (one per model; its entry is dropped when nobody holds or waits for it)."""
        key = model_id.hex()
        lk = self._locks.setdefault(key, trio.Lock())
        try:
            async with lk:
                yield
        finally:
            if not lk.locked() and lk.statistics().tasks_waiting == 0 and self._locks.get(key) is lk:
                del self._locks[key]

    def busy(self, model_id_hex: str) -> bool:
        """True while some task holds or waits for that model's lock."""
        return model_id_hex in self._locks

    # ------------------------------------------------------------ accounting

    async def scan(self) -> dict[str, int]:
        """Bytes per fetched model on disk (scanned once, in a thread; stale part files and temp dirs removed)."""
        async with self._scanning:
            if self._bytes is None:
                self._bytes = await trio.to_thread.run_sync(self._scan)
        return self._bytes

    def _scan(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if not self.root.is_dir():
            return out
        for d in self.root.iterdir():
            if d.name.startswith(".") or any(m in d.name for m in TEMP_MARKERS):
                shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
                continue
            if not d.is_dir():
                continue
            for f in d.iterdir():
                if any(m in f.name for m in TEMP_MARKERS) and f.is_file():
                    f.unlink(missing_ok=True)  # a part file of a fetch that never finished (this node crashed)
            out[d.name] = _dir_bytes(d)
        return out

    def used(self) -> int:
        """Bytes of all fetched models on disk plus those reserved by fetches in flight."""
        return sum((self._bytes or {}).values()) + sum(self._reserved.values())

    def model_used(self, model_id: bytes) -> int:
        """Bytes of ``model_id`` on disk plus those reserved for it."""
        key = model_id.hex()
        return (self._bytes or {}).get(key, 0) + self._reserved.get(key, 0)

    @asynccontextmanager
    async def reserve(self, model_id: bytes, unit: int) -> AsyncIterator[int]:
        """Reserve room for one file of ``model_id`` of at most ``unit`` bytes; yields the bytes granted (the
        limit to read the file under: less than ``unit`` when the model's cap leaves less). On exit the
        reservation is released and the model's size re-counted from disk (what was installed stays counted).

        A grant smaller than ``unit`` waits until the model's other fetches are done (their reservations may have
        been larger than their files). Room in total is made by evicting least recently used models.

        Raises:
            OverCap: the model's cap is reached, or not enough room in total can be made.
        """
        granted = await self._grant(model_id, unit)
        key = model_id.hex()
        try:
            yield granted
        finally:
            self._reserved[key] -= granted
            if not self._reserved[key]:
                del self._reserved[key]
            with trio.CancelScope(shield=True):
                await self.recount(model_id)

    async def _grant(self, model_id: bytes, unit: int) -> int:
        key = model_id.hex()
        sizes = await self.scan()
        async with self._changed:
            while True:
                left = self.max_model_bytes - sizes.get(key, 0) - self._reserved.get(key, 0)
                want = min(unit, left)
                if want < unit and self._reserved.get(key, 0):
                    await self._changed.wait()  # the model's other fetches may leave room when they end
                    continue
                if want <= 0:
                    raise OverCap(f"model {key[:16]} holds {sizes.get(key, 0)} bytes: its cap is "
                                  f"{self.max_model_bytes} bytes")
                short = self.used() + want - self.max_total_bytes
                if short > 0 and not await self._evict(short, but=key):
                    if sum(self._reserved.values()):
                        await self._changed.wait()  # fetches in flight give back what their files did not use
                        continue
                    raise OverCap(f"fetched models hold {self.used()} bytes: {want} more would pass the "
                                  f"{self.max_total_bytes}-byte cap and nothing more can be evicted")
                if short > 0:
                    continue  # evicted something: count again
                self._reserved[key] = self._reserved.get(key, 0) + want
                return want

    async def recount(self, model_id: bytes) -> None:
        """Count ``model_id``'s bytes on disk again (after files were installed or removed); wakes waiters."""
        key = model_id.hex()
        sizes = await self.scan()
        n = await trio.to_thread.run_sync(_dir_bytes, self.root / key)
        if n or (self.root / key).is_dir():
            sizes[key] = n
        else:
            sizes.pop(key, None)
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------ LRU

    def touch(self, model_id: bytes) -> None:
        """Mark ``model_id`` used now (the mtime of its dir's ``.used`` file orders eviction)."""
        d = self.root / model_id.hex()
        if d.is_dir():
            (d / USED_FILE).touch()

    def _last_used(self, key: str) -> float:
        for p in (self.root / key / USED_FILE, self.root / key):
            try:
                return p.stat().st_mtime
            except OSError:
                continue
        return 0.0

    async def _evict(self, need: int, but: str) -> bool:
        """Remove whole fetched models, least recently used first, until ``need`` bytes are freed or none is
        left that may go (not ``but``, not kept, not locked, nothing reserved). Returns whether any was removed."""
        sizes = await self.scan()
        victims = sorted((k for k in sizes if k != but and k not in self.keep and not self.busy(k)
                          and not self._reserved.get(k)), key=self._last_used)
        freed, removed = 0, False
        for key in victims:
            if freed >= need:
                break
            gone = self.root / f".evict-{key}"
            try:
                os.rename(self.root / key, gone)  # at once: a reader sees the whole model or none of it
            except OSError as e:
                log.warning("cannot evict fetched model %s: %s", key[:16], e)
                continue
            freed += sizes.pop(key, 0)
            removed = True
            self.evicted = [*self.evicted[-63:], key]
            log.info("evicted fetched model %s (least recently used; %d bytes)", key[:16], freed)
            await trio.to_thread.run_sync(shutil.rmtree, gone, True)
        return removed
