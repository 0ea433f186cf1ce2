"""``bench/ledger.py --scale``: what the ledger costs when it holds 10^4, 10^5 and 10^6 receipts (issue 13, check 1).

For each size n, in fresh subprocesses (so resident memory is per size):

1. **build** (its own process): a one-validator store is created (genesis state written by
   :meth:`~node.ledger.store.LedgerStore.replay`), then n *synthetic final* receipt records and their sessions are
   written straight into the state tables (``S/r/`` and ``S/s/``, :data:`node.ledger.statedb.PREFIX` /
   :data:`~node.ledger.statedb.CODECS`) in write batches, the counts in ``S/m`` are fixed, and LevelDB is compacted.
   Not n signed blocks: 10^6 receipts through blocks would take hours here. Each record is a real receipt with two
   real Ed25519 signatures (worker and requester), status ``settled``, paid to its worker; the account balances do
   not reflect those payouts (no block moved them), which nothing measured here reads. The compaction is over an
   explicit key range and checked to leave level 0 empty (plyvel 1.5's ``compact_range()`` without a range compacted
   nothing here, so the measurements before 2026-12-02 ran beside background compactions).
2. **measure** (a second process): start time (``LedgerStore(path, g)`` + ``replay()``, warm OS page cache: the
   store was just written), VmRSS after start and after the blocks, time per empty block (``propose`` +
   ``commit_block`` + ``append``: fsynced write batch included, the bench's own byte-counting reads left out;
   median of ``--empty``), time per block of ``--per-block`` (default 1000)
   pre-signed real receipts (same steps; ``propose`` without a mempool verifies every signature once, on every core,
   before it applies the block; median of ``--full``), stored bytes per live state item (keys + values under ``S/`` over
   the entries of every table), snapshot bytes per live item (the chunks :func:`node.ledger.snapshot.make` writes, over
   the items its manifest counts) and stored bytes per empty
   block (net bytes of keys + values the block adds to LevelDB, counted on its write batch against the values it
   replaces; the counter is checked once per size against a full key dump before and after one more, untimed,
   block at the end).

LevelDB reads its table files as the node does, with pread into its block cache
(:mod:`node.ledger.leveldb_reads`); unless ``--no-mmap``, a copy of each store, made before the first measurement,
is measured the same way with LevelDB's memory-mapped reads (``TALLY_LEVELDB_MMAP=1``), side by side.

Chain parameters: block time 200 ms, sampling 1 % (``sample_base_ppm`` = ``sample_floor_ppm`` = 10 000), challenge
window 4 blocks, 4 bonded workers and 20 requesters: accounts stay few (25 with the validator), so the per-block
scans over accounts (``State.state_root``, ``State.eligible``) are cheap here, but still O(accounts).

Usage: ``.venv/bin/python bench/ledger.py --scale [--sizes 10000,100000,1000000] [--timeout S]``, or this file
directly with the same flags.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.encoding import H, pack, unpack
from node.identity import Identity, dev_seed
from node.ledger import leveldb_reads, snapshot, statedb
from node.ledger.core import (
    jmt,
    tree as tr,
)
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.state import MAPS, SETS, ReceiptRecord
from node.ledger.core.status import SETTLED
from node.ledger.core.tx import Receipt, decode_tx
from node.ledger.genesis import Genesis, Params
from node.ledger.store import LedgerStore

C = 10**9
SAMPLE_PPM = 10_000
BLOCK_MS = 200
TARGET_RATIO = 2.0  # memory and per-block times at the largest size within 2x of the smallest (issue 13)
TARGET_BLOCK_S = 0.5  # a full block proposed, committed and fsynced at the largest size (issue 27, check 2)
TARGET_BLOCK_RATIO = 1.3  # ... within 1.3x of the same block at the smallest size (issue 27)
TARGET_RSS_RATIO = 1.5  # resident memory after blocks, largest / smallest size (issue 27)
PER_BLOCK = 1000  # receipts per full block (issue 27's check 2; 100 before it)
TARGET_START_S = 5.0
TARGET_EMPTY_B = 250
DEFAULT_SIZES = (10**4, 10**5, 10**6)


def keys() -> tuple[Identity, list[Identity], list[Identity]]:
    """The validator, the 4 workers and the 20 requesters (fixed dev seeds)."""
    return (Identity.from_seed(dev_seed(0)), [Identity.from_seed(dev_seed(i)) for i in range(1, 5)],
            [Identity.from_seed(dev_seed(i)) for i in range(10, 30)])


def scale_genesis() -> Genesis:
    """The one-validator chain every size uses (see the module docstring for its parameters)."""
    val, workers, requesters = keys()
    params = Params(block_time_ms=BLOCK_MS, price_per_token_block=1, max_receipt_price=C,
                    sample_base_ppm=SAMPLE_PPM, sample_floor_ppm=SAMPLE_PPM, challenge_window=4)
    balances = ([(val.account, 100 * C, 200 * C)] + [(w.account, 0, 100 * C) for w in workers]
                + [(r.account, 10**6 * C, 0) for r in requesters])
    return Genesis("tally-bench-scale", 0, (val.account,), tuple(balances), params)


def rss_mib(field: str = "VmRSS") -> float:
    """Resident memory of this process in MiB: ``field`` of /proc/self/status (``VmRSS`` all of it, ``RssAnon``
    the heap, ``RssFile`` file pages mapped in, such as LevelDB's memory-mapped table files).

    Raises:
        RuntimeError: no such line (not Linux).
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss_split() -> dict[str, float]:
    """``{"VmRSS", "RssAnon", "RssFile", "ldb"}`` in MiB (see :func:`rss_mib`); ``ldb``: the resident part of
    LevelDB's memory-mapped table files (``*.ldb`` / ``*.sst`` mappings in /proc/self/smaps)."""
    out = {f: rss_mib(f) for f in ("VmRSS", "RssAnon", "RssFile")}
    kib, in_ldb = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's header: address perms offset dev inode [path]
            in_ldb = len(head) >= 6 and head[5].endswith((".ldb", ".sst"))
        elif in_ldb and head and head[0] == "Rss:":
            kib += int(head[1])
    out["ldb"] = kib / 1024
    return out


def make_receipt(g: Genesis, w: Identity, r: Identity, session_id: bytes, opened_height: int, salt: bytes) -> Receipt:
    """A receipt signed by worker ``w`` and countersigned by requester ``r``: 10 tokens on span [0, 10), price
    100 base units (work × ``price_per_token_block`` = 1)."""
    rc = Receipt(g.domain, session_id, w.account, r.account, H(b"model"), 0, 10, 10, H(b"in", salt),
                 H(b"out", salt), 100, opened_height)
    return rc.sign_worker(w).countersign(r)


# ------------------------------------------------------------------ build (child process)

def build(path: Path, n: int, chunk: int = 10_000) -> dict[str, Any]:
    """Create the store at ``path`` holding ``n`` synthetic final receipts and their sessions (see the module
    docstring). Returns ``{"write_s", "compact_s"}`` (seconds).

    Raises:
        ValueError: ``path`` already holds a ledger.
    """
    if path.exists() and any(path.iterdir()):
        raise ValueError(f"{path} is not empty")
    g = scale_genesis()
    _, workers, requesters = keys()
    store = LedgerStore(path, g)
    t0 = time.perf_counter()
    store.replay()  # no state stored: writes the genesis state (height 0)
    db = store.db
    rp, sp = statedb.PREFIX["receipts"], statedb.PREFIX["sessions"]
    rcodec, scodec = statedb.CODECS["receipts"], statedb.CODECS["sessions"]
    changes: dict[bytes, bytes | None] = {}  # the synthetic entries' state-tree leaves (node.ledger.core.tree)
    for lo in range(0, n, chunk):
        with db.write_batch() as wb:
            for i in range(lo, min(n, lo + chunk)):
                w, r = workers[i % len(workers)], requesters[i % len(requesters)]
                ib = i.to_bytes(8, "big")
                rc = make_receipt(g, w, r, b"\xfe" * 8 + ib, 0, ib)
                rec = ReceiptRecord(receipt=rc, height=0, status=SETTLED, p_ppm=SAMPLE_PPM,
                                    payouts=((w.account, rc.price),))
                raw_r, skey, raw_s = rcodec.dumps(rec), H(w.account, rc.session_id), scodec.dumps(rc.id)
                wb.put(rp + rc.id, raw_r)
                wb.put(sp + skey, raw_s)
                changes[tr.entry_key("receipts", rc.id)] = tr.leaf_value(raw_r)
                changes[tr.entry_key("sessions", skey)] = tr.leaf_value(raw_s)
    meta = statedb.read_meta(db)
    assert meta is not None, "replay() wrote no state"
    height, last, seq, counts, root = meta
    counts["receipts"] = counts.get("receipts", 0) + n
    counts["sessions"] = counts.get("sessions", 0) + n
    # the state root covers them too: one tree update (version 1; the next block takes version 2)
    res = jmt.update(tr.LevelNodes(db), root.version + 1, root, changes)
    items = list(res.writes.items())
    for lo in range(0, len(items), 50_000):
        with db.write_batch() as wb:
            for k, v in items[lo:lo + 50_000]:
                wb.put(tr.NODES + k, v)
    db.put(statedb.META, pack([statedb.FORMAT, height, last, seq, counts, res.root.to_bytes()]), sync=True)
    t1 = time.perf_counter()
    # a long-lived node's tables are compacted; no compaction runs during the measurement. An explicit range:
    # plyvel 1.5's compact_range() without one compacted nothing here (the measurements before 2026-12-02 ran with
    # background compactions of 8 level-0 files under way)
    db.compact_range(start=b"\x00", stop=b"\xff" * 64)
    levels = [db.get_property(b"leveldb.num-files-at-level%d" % i) for i in range(3)]
    if levels[0] != b"0":
        raise RuntimeError(f"level 0 still holds {levels[0]!r} files after the compaction")
    t2 = time.perf_counter()
    store.close()
    return {"write_s": t1 - t0, "compact_s": t2 - t1}


# ------------------------------------------------------------------ measure (child process)

class _CountingBatch:
    """A ``WriteBatch`` that, when written, records the net bytes (keys + values) it adds to ``db``: each key's
    last write counted against the value it replaces (a deletion subtracts what it removes)."""

    def __init__(self, db: Any, owner: _CountingDB, **kw: Any):
        self.db, self.owner, self.kw = db, owner, kw
        self.ops: dict[bytes, bytes | None] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self.ops[bytes(key)] = bytes(value)

    def delete(self, key: bytes) -> None:
        self.ops[bytes(key)] = None

    def __enter__(self) -> _CountingBatch:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if et is not None:
            return
        t0 = time.perf_counter()
        net = 0
        for k, v in self.ops.items():
            old = self.db.get(k)
            net += (0 if v is None else len(k) + len(v)) - (0 if old is None else len(k) + len(old))
        t = time.perf_counter()
        self.owner.last_count_s = t - t0  # the bench's own reads, not the block's: left out of its time
        with self.db.write_batch(**self.kw) as wb:
            for k, v in self.ops.items():
                if v is None:
                    wb.delete(k)
                else:
                    wb.put(k, v)
        self.owner.last_write_s = time.perf_counter() - t
        self.owner.last_net = net


class _CountingDB:
    """``plyvel.DB`` stand-in for :attr:`LedgerStore.db` whose write batches count their net bytes (everything else
    is the real database)."""

    def __init__(self, db: Any):
        self._db = db
        self.last_net = 0
        self.last_write_s = 0.0  # seconds the last batch took to write (fsync included)
        self.last_count_s = 0.0  # seconds the last batch spent reading the values it replaces (to count bytes)

    def write_batch(self, **kw: Any) -> _CountingBatch:
        return _CountingBatch(self._db, self, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def _dump_bytes(db: Any) -> int:
    return sum(len(k) + len(v) for k, v in db.iterator())


def _block(store: LedgerStore, state: Any, txs: list, val: Identity) -> tuple[Any, float]:
    t = time.perf_counter()
    block, new, rejected = propose(state, txs, val, (state.height + 1) * BLOCK_MS, store.last_commit())
    if rejected:
        raise RuntimeError(f"{len(rejected)} receipts refused, first: {rejected[0][1]}")
    store.append(block, commit_block(val, block), state, new)
    counted = store.db.last_count_s if isinstance(store.db, _CountingDB) else 0.0
    return new, time.perf_counter() - t - counted


def measure(path: Path, n: int, empty: int = 30, full: int = 10, per_block: int = 100,
            profile: bool = False) -> dict[str, Any]:
    """Open the store built by :func:`build` and measure it (see the module docstring). Times in seconds, memory
    in MiB, sizes in bytes.

    Raises:
        RuntimeError: the store does not hold ``n`` receipts, a receipt is refused, or the counted bytes of an
            check block differ from a full key dump's.
    """
    g = scale_genesis()
    val, workers, requesters = keys()
    rss_base = rss_mib()
    t0 = time.perf_counter()
    store = LedgerStore(path, g)
    state = store.replay()
    start_s = time.perf_counter() - t0
    rss_start = rss_mib()
    phases_start = rss_split()
    if len(state.receipts) != n:
        raise RuntimeError(f"the store holds {len(state.receipts)} receipts, not {n}")
    pre = []
    for i in range(full * per_block):  # fresh decoded objects, as a node gets them from a block: no cached ids
        rc = make_receipt(g, workers[i % len(workers)], requesters[i % len(requesters)], os.urandom(16), 0,
                          os.urandom(8))
        pre.append(decode_tx(unpack(pack(rc.to_wire()))))
    phases = {"presigned": rss_split()}
    counting = _CountingDB(store.db)
    store.db = counting  # type: ignore[assignment]
    prof = cProfile.Profile() if profile else None
    empty_t, empty_b, write_t = [], [], []
    for _ in range(empty):
        if prof:
            prof.enable()
        state, dt = _block(store, state, [], val)
        if prof:
            prof.disable()
        empty_t.append(dt)
        empty_b.append(counting.last_net)
        write_t.append(counting.last_write_s)
    phases["empty blocks"] = rss_split()
    full_t, full_w = [], []
    full_prof = cProfile.Profile() if profile else None
    for j in range(full):
        if full_prof:
            full_prof.enable()
        state, dt = _block(store, state, pre[j * per_block:(j + 1) * per_block], val)
        if full_prof:
            full_prof.disable()
        full_t.append(dt)
        full_w.append(counting.last_write_s)
    rss_after = rss_mib()
    phases["after"] = rss_split()
    # the byte counter checked: one more empty block (untimed, after the RSS reading: a full key dump reads every
    # table and leaves tens of MiB resident) against a full key dump before and after it
    before = _dump_bytes(store.db)
    state, _ = _block(store, state, [], val)
    dumped = _dump_bytes(store.db) - before
    if dumped != counting.last_net:
        raise RuntimeError(f"check block: {counting.last_net} B counted, {dumped} B by key dump")
    items = {t: len(state.tables[t]) for t in MAPS + SETS}
    s_bytes = r_bytes = 0
    for k, v in store.db.iterator(prefix=b"S/"):
        s_bytes += len(k) + len(v)
        if k.startswith(statedb.PREFIX["receipts"]):
            r_bytes += len(k) + len(v)
    snap_bytes = [0]  # the chunks node.ledger.snapshot.make writes (counted one at a time, not kept)
    manifest, _ = snapshot.make(store.db, g.domain, put=lambda _id, data: snap_bytes.__setitem__(
        0, snap_bytes[0] + len(data)))
    out = {
        "n": n, "read_mode": store.read_mode.value, "start_s": start_s, "rss_base_mib": rss_base,
        "rss_start_mib": rss_start, "rss_after_mib": rss_after,
        "empty_ms": statistics.median(empty_t) * 1e3,
        "empty_p90_ms": sorted(empty_t)[int(0.9 * (len(empty_t) - 1))] * 1e3,
        "full_ms": statistics.median(full_t) * 1e3, "per_block": per_block,
        "rss_phases_mib": {"start": phases_start, **phases},
        "empty_cpu_ms": statistics.median(a - b for a, b in zip(empty_t, write_t, strict=False)) * 1e3,
        "full_cpu_ms": statistics.median(a - b for a, b in zip(full_t, full_w, strict=False)) * 1e3,
        "empty_write_ms": statistics.median(write_t) * 1e3, "full_write_ms": statistics.median(full_w) * 1e3,
        "empty_b": statistics.median(empty_b), "empty_b_max": max(empty_b[1:] or empty_b), "check_b": dumped,
        "bytes_per_item": s_bytes / max(1, sum(items.values())),
        "snapshot_bytes": snap_bytes[0], "snapshot_per_item": snap_bytes[0] / max(1, sum(manifest.counts)),
        "bytes_per_receipt": r_bytes / max(1, items["receipts"]),
        "items": items, "accounts": items["accounts"], "open_receipts": items["open_receipts"], "height": state.height,
    }
    store.close()
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        s.write(f"--- the {full} blocks of {per_block} receipts ---\n")
        pstats.Stats(full_prof, stream=s).sort_stats("tottime").print_stats(25)
        out["profile"] = s.getvalue()
    return out


# ------------------------------------------------------------------ parent: one size per subprocess pair

def _child(args: list[str], timeout: float, mmap: bool = False) -> dict[str, Any]:
    """Run this file as a child with ``args`` (``mmap``: with ``TALLY_LEVELDB_MMAP=1``, LevelDB's memory-mapped
    table reads); its result (the JSON on its last stdout line).

    Raises:
        RuntimeError: the child failed or ran past ``timeout`` seconds (it is killed then).
    """
    try:
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                           timeout=timeout, env=_env(mmap))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(args[:2])} ran past {timeout:.0f} s and was killed") from None
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"{' '.join(args[:2])} failed (exit {r.returncode}): {r.stderr.strip()[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _env(mmap: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != leveldb_reads.ENV_KEEP_MMAP}
    if mmap:
        env[leveldb_reads.ENV_KEEP_MMAP] = "1"
    return env


CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def capped_measure(d: Path, n: int, cap_mib: float, timeout: float, empty: int, full: int,
                   mmap: bool = False) -> dict[str, Any]:
    """:func:`measure` of the store at ``d`` in a child confined to a memory cgroup (v1) of ``cap_mib`` MiB, after
    the store's files are written back and dropped from the OS page cache (so that the pages the child reads are
    charged to its cgroup): what the ledger does when the kernel holds it to that much memory, page cache
    included. The result has ``cap_mib``, ``cap_max_usage_mib`` (the cgroup's peak), ``cap_failcnt`` (times the
    limit was hit) and ``cap_major_faults``.

    Raises:
        RuntimeError: no writable cgroup v1 memory controller here (needs root), or the child failed (an OOM kill
            included).
    """
    if not (CGROUP_V1 / "cgroup.procs").exists() or not os.access(CGROUP_V1, os.W_OK):
        raise RuntimeError(f"--cap-mib needs a writable cgroup v1 memory controller at {CGROUP_V1} (root)")
    for f in d.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    cg = CGROUP_V1 / f"tally-bench-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(int(cap_mib * 2**20)))
        args = [sys.executable, str(Path(__file__).resolve()), "--child", "measure", "--n", str(n), "--dir", str(d),
                "--empty", str(empty), "--full", str(full)]
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env(mmap),
                           preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())))
        if r.returncode != 0 or not r.stdout.strip():
            raise RuntimeError(f"the capped measurement failed (exit {r.returncode}; -9 is an OOM kill): "
                               f"{r.stderr.strip()[-800:]}")
        out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
        out.update(cap_mib=cap_mib, cap_max_usage_mib=int((cg / "memory.max_usage_in_bytes").read_text()) / 2**20,
                   cap_failcnt=int((cg / "memory.failcnt").read_text()),
                   cap_major_faults=int(stat.get("total_pgmajfault", 0)))
        return out
    finally:
        cg.rmdir()


def _size(n: int) -> str:
    e = len(str(n)) - 1
    return f"10^{e}" if n == 10**e else str(n)


def run_scale(sizes: list[int], timeout: float = 1800, empty: int = 30, full: int = 10, profile: bool = False,
              keep: Path | None = None, cap: float | None = None, mmap_too: bool = True,
              per_block: int = PER_BLOCK) -> list[dict[str, Any]]:
    """Build and measure each size in fresh subprocesses, print the table and the targets; returns the rows.
    ``per_block``: receipts per full block.

    Args:
        sizes: receipts held, ascending.
        timeout: seconds allowed to each child (build, then measure).
        keep: a directory to build the stores in and leave them (default: a temporary one, removed). A store
            already there (``keep/ledger-<n>``, from an earlier run) is not built again; every kept store is
            measured on a copy, so it stays as built and serves the next run (and ``--rate --store-dir``).
        cap: also measure the largest size again in a memory cgroup of ``cap`` times the smallest size's resident
            memory after blocks (:func:`capped_measure`).
        mmap_too: also measure a copy of each store (made before the first measurement) with LevelDB's
            memory-mapped reads (``TALLY_LEVELDB_MMAP=1``; the node reads with pread:
            :mod:`node.ledger.leveldb_reads`), side by side; under ``cap`` too.

    Raises:
        ValueError: no sizes, or a size below 1.
        RuntimeError: a child failed or timed out.
    """
    if not sizes or min(sizes) < 1:
        raise ValueError("--sizes needs positive receipt counts")
    sizes = sorted(sizes)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tally-scale-") as tmp:
        base = keep or Path(tmp)
        dirs = {}
        for n in sizes:
            d = base / f"ledger-{n}"
            if keep is not None and (d / "CURRENT").exists():
                b = {"write_s": 0.0, "compact_s": 0.0}  # built by an earlier run
            else:
                b = _child(["--child", "build", "--n", str(n), "--dir", str(d)], timeout)
            if keep is not None:  # measured on a copy: the kept store stays as built
                shutil.copytree(d, Path(tmp) / f"ledger-{n}")
                d = Path(tmp) / f"ledger-{n}"
            dirs[n] = d
            dm = Path(tmp) / f"ledger-{n}-mmap"
            if mmap_too:
                shutil.copytree(d, dm)
                os.sync()  # the copy's dirty pages would otherwise be written back during the measurements
            args = ["--empty", str(empty), "--full", str(full), "--per-block", str(per_block),
                    *(["--profile"] if profile else [])]
            m = _child(["--child", "measure", "--n", str(n), "--dir", str(d), *args], timeout)
            if mmap_too:
                m["mmap"] = _child(["--child", "measure", "--n", str(n), "--dir", str(dm), *args], timeout, mmap=True)
            m.update(b)
            m["disk_mib"] = sum(f.stat().st_size for f in d.iterdir()) / 2**20
            rows.append(m)
            print(f"  {_size(n)}: built in {b['write_s']:.0f} s + {b['compact_s']:.0f} s compaction, measured",
                  file=sys.stderr, flush=True)
            if profile:
                print(m.get("profile", ""), file=sys.stderr)
        if cap:
            lo, hi = rows[0], rows[-1]
            hi["capped"] = capped_measure(dirs[hi["n"]], hi["items"]["receipts"],
                                          cap * lo["rss_after_mib"], timeout, empty, full)
            if mmap_too:
                hi["capped_mmap"] = capped_measure(Path(tmp) / f"ledger-{hi['n']}-mmap",
                                                   hi["mmap"]["items"]["receipts"], cap * lo["rss_after_mib"],
                                                   timeout, empty, full, mmap=True)
        if mmap_too and keep is None:
            for n in sizes:
                shutil.rmtree(base / f"ledger-{n}-mmap", ignore_errors=True)
    print(report(rows, empty, full))
    return rows


def report(rows: list[dict[str, Any]], empty: int = 30, full: int = 10) -> str:
    """The printed table, ratios and targets for ``rows`` (from :func:`measure`), smallest size first."""
    per = rows[0]["per_block"]
    lines = [
        "ledger at scale (bench/ledger_scale.py): each size's store holds n synthetic FINAL receipts "
        "(+ their sessions)",
        "written straight into the state tables, NOT through n signed blocks; each size built and measured in fresh",
        f"processes. One validator, {rows[0]['accounts']} accounts, 1 % sampling, challenge window 4, fsynced blocks.",
        f"LevelDB reads its tables with {rows[0]['read_mode']} (the node's setting: node/ledger/leveldb_reads.py).",
        "",
        f"{'receipts':>9} {'start s':>8} {'RSS base':>9} {'RSS start':>10} {'RSS after':>10} {'anon after':>11} "
        f"{'ldb after':>10} "
        f"{'empty blk':>10} "
        f"{'(cpu)':>7} {f'{per}-rcpt blk':>13} {'(cpu)':>8} {'B/live item':>12} {'B/receipt':>10} "
        f"{'snap B/item':>12} {'B/empty blk':>12} {'disk MiB':>9} {'build s':>8}",
    ]
    for r in rows:
        lines.append(
            f"{_size(r['n']):>9} {r['start_s']:8.3f} {r['rss_base_mib']:7.1f}Mi {r['rss_start_mib']:8.1f}Mi "
            f"{r['rss_after_mib']:8.1f}Mi {r['rss_phases_mib']['after']['RssAnon']:9.1f}Mi "
            f"{r['rss_phases_mib']['after']['ldb']:8.1f}Mi {r['empty_ms']:8.2f}ms {r['empty_cpu_ms']:5.2f}ms "
            f"{r['full_ms']:11.1f}ms "
            f"{r['full_cpu_ms']:6.1f}ms {r['bytes_per_item']:12.0f} "
            f"{r['bytes_per_receipt']:10.0f} {r['snapshot_per_item']:12.0f} {r['empty_b']:12.0f} {r['disk_mib']:9.1f} "
            f"{r['write_s'] + r['compact_s']:8.0f}")
    lines += [
        "",
        f"RSS base: the interpreter and imports before the store opens; RSS after: after {empty} empty blocks and "
        f"{full} blocks of {rows[0]['per_block']} receipts (VmRSS); anon after: its RssAnon (heap: LevelDB's 8 MiB "
        "block cache included); the rest is RssFile: the interpreter's and libraries' code and, with memory-mapped "
        "reads, the pages of LevelDB's table files that lookups touched (ldb after: clean page-cache pages that the "
        "process holds mapped; 0 with pread).",
        f"empty blk / {per}-rcpt blk: median of {empty} / {full} (propose + commit_block + append, fsync included; "
        "propose verifies each receipt's 2 signatures once, on every core); (cpu): the same less the batch write + "
        "fsync, which "
        "on this shared disk is most of an empty block and noisy.",
        "B/live item: keys + values under S/ over every state table's entries; B/receipt: the S/r/ records alone; "
        "snap B/item: a state snapshot's chunks (node.ledger.snapshot.make, what state sync fetches) over the live "
        "items its manifest counts.",
        "B/empty blk: median net bytes (keys + values) an empty block adds to LevelDB (block record, explorer index, "
        "state meta and undo record), counted on its write batch (the count equals a full key dump's diff on one "
        f"more block at every size: {', '.join(str(r['check_b']) for r in rows)} B; that block settles "
        "receipts).",
        "disk MiB: the LevelDB directory (compressed tables + log); start is with a warm OS page cache.",
        "",
    ]
    if all("mmap" in r for r in rows):
        lines += [
            "the same stores (a copy of each, made before the first measurement) with LevelDB's memory-mapped reads "
            "(TALLY_LEVELDB_MMAP=1, LevelDB's default), measured in the same run:",
            f"{'receipts':>9} {'RSS after':>10} {'anon after':>11} {'ldb after':>10} {'empty blk':>10} "
            f"{f'{per}-rcpt blk':>13}",
        ]
        for r in rows:
            mm = r["mmap"]
            lines.append(f"{_size(r['n']):>9} {mm['rss_after_mib']:8.1f}Mi "
                         f"{mm['rss_phases_mib']['after']['RssAnon']:9.1f}Mi "
                         f"{mm['rss_phases_mib']['after']['ldb']:8.1f}Mi {mm['empty_ms']:8.2f}ms "
                         f"{mm['full_ms']:11.1f}ms")
        lines.append("")
    lo, hi = rows[0], rows[-1]
    name = f"{_size(hi['n'])} / {_size(lo['n'])}"
    checks: list[tuple[str, bool, str]] = []
    for key, what in (("rss_after_mib", "resident memory (after blocks)"), ("empty_ms", "time per empty block"),
                      ("full_ms", f"time per {per}-receipt block")):
        ratio = hi[key] / lo[key]
        lines.append(f"ratio {name}, {what}: {ratio:.2f}x")
        checks.append((f"{what} within {TARGET_RATIO:g}x", ratio <= TARGET_RATIO, f"{ratio:.2f}x"))
    for key, what in (("empty_cpu_ms", "time per empty block less write + fsync"),
                      ("full_cpu_ms", f"time per {per}-receipt block less write + fsync")):
        lines.append(f"ratio {name}, {what}: {hi[key] / lo[key]:.2f}x (shown, not a target)")
    if "mmap" in lo and "mmap" in hi:
        for key, what in (("rss_after_mib", "resident memory (after blocks)"),
                          ("full_ms", f"time per {per}-receipt block")):
            lines.append(f"ratio {name}, {what}, memory-mapped reads: {hi['mmap'][key] / lo['mmap'][key]:.2f}x "
                         "(shown, not a target)")
        lines.append(f"pread / memory-mapped, {per}-receipt block: {lo['full_ms'] / lo['mmap']['full_ms']:.2f}x at "
                     f"{_size(lo['n'])}, {hi['full_ms'] / hi['mmap']['full_ms']:.2f}x at {_size(hi['n'])} (shown)")
    per, full_hi = lo["per_block"], hi["full_ms"] / 1e3
    checks.append((f"a {per}-receipt block at {_size(hi['n'])} in <= {TARGET_BLOCK_S:g} s (issue 27)",
                   full_hi <= TARGET_BLOCK_S, f"{full_hi:.3f} s ({per / full_hi:.0f} receipts/s)"))
    ratio = hi["full_ms"] / lo["full_ms"]
    checks.append((f"the {per}-receipt block within {TARGET_BLOCK_RATIO:g}x of {_size(lo['n'])}'s (issue 27)",
                   ratio <= TARGET_BLOCK_RATIO, f"{ratio:.2f}x"))
    ratio = hi["rss_after_mib"] / lo["rss_after_mib"]
    checks.append((f"resident memory within {TARGET_RSS_RATIO:g}x (issue 27)", ratio <= TARGET_RSS_RATIO,
                   f"{ratio:.2f}x"))
    anon = hi["rss_phases_mib"]["after"]["RssAnon"] / lo["rss_phases_mib"]["after"]["RssAnon"]
    lines.append(f"ratio {name}, resident anonymous memory (RssAnon) after blocks: {anon:.2f}x (shown, not a target)")
    lines.append(f"ratio {name}, resident memory after start: {hi['rss_start_mib'] / lo['rss_start_mib']:.2f}x "
                 "(shown, not a target)")
    slow = max(rows, key=lambda r: r["start_s"])
    checks.append((f"start under {TARGET_START_S:g} s at every size", all(r["start_s"] < TARGET_START_S for r in rows),
                   f"slowest {slow['start_s']:.3f} s at {_size(slow['n'])}"))
    big = max(rows, key=lambda r: r["empty_b"])
    checks.append((f"an empty block <= {TARGET_EMPTY_B} B stored", all(r["empty_b"] <= TARGET_EMPTY_B for r in rows),
                   f"largest median {big['empty_b']:.0f} B at {_size(big['n'])}, max {big['empty_b_max']} B"))
    for c, how, unc in ((hi.get("capped"), lo["read_mode"], hi), (hi.get("capped_mmap"), "memory-mapped reads",
                                                                  hi.get("mmap"))):
        if not c or not unc:
            continue
        lines += ["", f"{how}, held to {c['cap_mib']:.0f} MiB "
                  f"(a memory cgroup of {c['cap_mib'] / lo['rss_after_mib']:.1f}x the "
                  f"{_size(lo['n'])} resident memory, page cache included; the store's pages dropped first), "
                  f"{_size(hi['n'])}: peak {c['cap_max_usage_mib']:.0f} MiB, limit hit {c['cap_failcnt']} times, "
                  f"{c['cap_major_faults']} major faults; empty block {c['empty_ms']:.2f} ms, {per}-receipt block "
                  f"{c['full_ms']:.1f} ms ({c['full_ms'] / lo['full_ms']:.2f}x the {_size(lo['n'])} one, "
                  f"{c['full_ms'] / unc['full_ms']:.2f}x uncapped); start {c['start_s']:.3f} s"]
    if len(rows) == 1:
        lines.append("(one size only: the ratios compare it with itself)")
    lines.append("")
    lines.append("targets:")
    for what, ok, detail in checks:
        lines.append(f"  {'MET    ' if ok else 'NOT MET'} {what}: {detail}")
    lines += [
        "",
        "still O(n) per block, n not the receipts held: State.state_root() and State.eligible() iterate every account "
        f"({hi['accounts']} here); end_block iterates the open receipts ({hi['open_receipts']} open at the end at "
        f"{_size(hi['n'])}); index_block lists the open receipts.",
    ]
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        out = [int(float(x)) for x in text.replace("_", "").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes comma-separated receipt counts, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("--sizes needs positive receipt counts")
    return out


def add_args(ap: argparse.ArgumentParser) -> None:
    """The ``--scale`` options (shared with bench/ledger.py)."""
    ap.add_argument("--sizes", type=_sizes, default=list(DEFAULT_SIZES),
                    help="receipts held, comma-separated (default 10000,100000,1000000; 1e6 works)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per build and per measurement "
                    "subprocess (default %(default)s)")
    ap.add_argument("--empty", type=int, default=30, help="empty blocks timed per size (default %(default)s)")
    ap.add_argument("--full", type=int, default=10, help="full blocks timed per size (default %(default)s)")
    ap.add_argument("--per-block", type=int, default=PER_BLOCK,
                    help="receipts per full block (default %(default)s: issue 27's check 2)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the empty and the full blocks; top functions to stderr")
    ap.add_argument("--keep", type=Path, default=None, help="build the stores under this directory and keep them")
    ap.add_argument("--cap", type=float, default=None, metavar="X",
                    help="also measure the largest size in a memory cgroup of X times the smallest size's resident "
                         "memory (page cache included; needs root and cgroup v1), e.g. --cap 2")
    ap.add_argument("--no-mmap", action="store_true",
                    help="skip the side-by-side measurement with LevelDB's memory-mapped reads (TALLY_LEVELDB_MMAP=1)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(ap)
    ap.add_argument("--child", choices=("build", "measure"), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "build":
        print(json.dumps(build(args.dir, args.n)))
    elif args.child == "measure":
        print(json.dumps(measure(args.dir, args.n, args.empty, args.full, args.per_block, profile=args.profile)))
    else:
        run_scale(args.sizes, args.timeout, args.empty, args.full, args.profile, args.keep, args.cap,
                  not args.no_mmap, args.per_block)


if __name__ == "__main__":
    main()
