"""LevelDB's table reads in a ledger process (node/ledger/leveldb_reads.py): pread into the block cache by default,
memory-mapped with TALLY_LEVELDB_MMAP=1. Each case runs in a fresh interpreter: the switch acts once per process,
before its first database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from node.ledger import leveldb_reads

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys
from pathlib import Path
from node.ledger.genesis import load_genesis
from node.ledger.store import LedgerStore
from node.ledger.leveldb_reads import read_mode_reason

path = Path(sys.argv[1])
store = LedgerStore(path, load_genesis())
db = store.db
for lo in range(0, 20000, 2000):  # about 2 MiB over several tables, then every key read back
    with db.write_batch() as wb:
        for i in range(lo, lo + 2000):
            wb.put(b"t/" + i.to_bytes(4, "big"), os.urandom(100))
db.compact_range(start=b"\x00", stop=b"\xff" * 8)
assert all(db.get(b"t/" + i.to_bytes(4, "big")) is not None for i in range(20000))
mapped = 0
for line in Path("/proc/self/maps").read_text().splitlines():
    parts = line.split()
    if len(parts) >= 6 and parts[5].endswith(".ldb"):
        mapped += 1
tables = len(list(path.glob("*.ldb")))
print(json.dumps({"mode": store.read_mode.value, "why": read_mode_reason(), "mapped": mapped, "tables": tables}))
store.close()
"""


def _run(tmp_path: Path, keep_mmap: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != leveldb_reads.ENV_KEEP_MMAP}
    if keep_mmap:
        env[leveldb_reads.ENV_KEEP_MMAP] = "1"
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / ("mmap" if keep_mmap else "pread"))],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_ledger_process_reads_tables_with_pread_not_mmap(tmp_path):
    got = _run(tmp_path, keep_mmap=False)
    assert got["tables"] >= 1
    assert got["mode"] == "pread", got["why"]
    assert "SetReadOnlyMMapLimit" in got["why"]
    assert got["mapped"] == 0  # no table file is mapped into the process


def test_the_environment_keeps_memory_mapped_reads(tmp_path):
    got = _run(tmp_path, keep_mmap=True)
    assert got["mode"] == "mmap" and leveldb_reads.ENV_KEEP_MMAP in got["why"]
    assert got["mapped"] >= 1  # LevelDB's default: the tables it read are mapped in


def test_symbol_lookup_refuses_what_is_not_an_elf_shared_object(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF" + bytes(200))
    assert leveldb_reads.symbol_offset(junk, leveldb_reads.SYMBOL) is None
    assert leveldb_reads.symbol_offset(tmp_path / "absent.so", leveldb_reads.SYMBOL) is None
    lib = leveldb_reads._mapped_library()
    assert lib is not None  # plyvel's bundled libleveldb, loaded by the import
    assert leveldb_reads.symbol_offset(lib[0], b"no_such_function_anywhere") is None
    off = leveldb_reads.symbol_offset(lib[0], leveldb_reads.SYMBOL)
    assert isinstance(off, int) and off > 0


def test_the_descriptor_limit_is_raised_never_lowered():
    code = ("import resource; from node.ledger.leveldb_reads import raise_fd_limit; "
            "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; resource.setrlimit(resource.RLIMIT_NOFILE, (256, h)); "
            "a = raise_fd_limit(4096); b = raise_fd_limit(1024); "
            "print(a, b, resource.getrlimit(resource.RLIMIT_NOFILE)[0], h)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    a, b, now, hard = (int(x) for x in r.stdout.split())
    want = 4096 if hard < 0 else min(4096, hard)
    assert a == b == now == want  # raised from 256 to 4096 (or the hard limit), and the lower target left it
