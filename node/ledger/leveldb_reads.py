"""How LevelDB reads its table files in this process: ``pread`` into its bounded block cache, not ``mmap``.

Why. LevelDB's POSIX environment memory-maps up to 1,000 table files (``kDefaultMmapLimit`` in
``util/env_posix.cc``) and serves reads from the mapping. Every page a lookup touches then stays mapped into the
process, and the kernel maps up to 16 neighbouring cached pages with each fault (``fault_around_bytes``). A
ledger whose state tree is read at random across hundreds of MiB thus shows that much as its own resident memory
(measured: 349 MiB of mapped table pages at 10^6 receipts, against 9 MiB at 10^4; ``bench/ledger.py --scale``).
Those pages are clean page cache, but the process holds them: another program on the machine cannot have them
until the kernel is under pressure, and a memory limit on the node (a container, a cgroup) charges them to it.

With ``pread``, each block LevelDB needs is read into its LRU block cache (8 MiB by default), which bounds what
the process holds; the OS still caches the files as it caches any file, and gives those pages to whoever needs
them. RocksDB, LevelDB's successor, reads this way by default (``allow_mmap_reads = false``).

How. LevelDB offers the switch only as ``leveldb::EnvPosixTestHelper::SetReadOnlyMMapLimit(int)``, compiled into the
library but not exported. :func:`prefer_pread` finds it by name in the symbol table (``.symtab``) of the
``libleveldb`` that plyvel loaded, checks that it is a function in that file, and calls it with 0 through ctypes (in
a release build it only stores the limit; a build with assertions would check that no environment exists yet). It
must run before the process's first ``plyvel.DB`` (the environment reads the limit once, when it is created):
:mod:`node.ledger.store` calls it when imported, and every ledger database is opened there. Where it cannot be done
(no such library mapped, a stripped build, another platform) nothing is called and LevelDB keeps memory-mapping: the
ledger works the same, only its resident memory counts the mapped pages.

A file read with ``pread`` keeps its descriptor open only while LevelDB's descriptor budget lasts (a fifth of the
soft ``RLIMIT_NOFILE``, read once with the limit above); past it, every read opens and closes the file. So
:func:`prefer_pread` first raises the soft limit towards the hard one (at most :data:`FD_TARGET`), as geth and
bitcoind raise theirs: with the common soft limit of 1,024, a ledger of 10^6 receipts (~370 table files) would
otherwise reopen files on most reads.

Setting ``TALLY_LEVELDB_MMAP=1`` in the environment keeps LevelDB's memory-mapped reads (the bench measures both).
"""

from __future__ import annotations

import ctypes
import os
import resource
import struct
from enum import Enum
from pathlib import Path

import plyvel  # noqa: F401  (loads the libleveldb this module looks into)

SYMBOL = b"_ZN7leveldb18EnvPosixTestHelper20SetReadOnlyMMapLimitEi"  # static void SetReadOnlyMMapLimit(int)
ENV_KEEP_MMAP = "TALLY_LEVELDB_MMAP"
_SHT_SYMTAB, _STT_FUNC = 2, 2
FD_TARGET = 65536  # soft RLIMIT_NOFILE that prefer_pread raises to, where the hard limit allows


class ReadMode(Enum):
    """How this process's LevelDB reads table files."""

    PREAD = "pread"  # into the block cache (prefer_pread took effect)
    MMAP = "mmap"  # memory-mapped: LevelDB's default (kept on purpose, or the switch was not found)


_mode: ReadMode | None = None
_why = ""


def _mapped_library() -> tuple[Path, int] | None:
    """Path and load address of the ``libleveldb`` shared object mapped into this process (its mapping at file
    offset 0, from /proc/self/maps), or None."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and "libleveldb" in Path(parts[5]).name and int(parts[2], 16) == 0:
            return Path(parts[5]), int(parts[0].split("-")[0], 16)
    return None


def symbol_offset(path: Path, name: bytes) -> int | None:
    """The value (offset from the load address) of function symbol ``name`` in the ELF64 little-endian shared
    object at ``path``, read from its ``.symtab`` (ELF spec, "Symbol Table"), or None when the file is not such
    an object, has no symbol table (stripped), or lacks a function of that name."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:  # ELFCLASS64, ELFDATA2LSB
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(data):
        return None
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for _, kind, _, _, off, size, link, _, _, entsize in sections:
        if kind != _SHT_SYMTAB or entsize != 24 or link >= shnum or off + size > len(data):
            continue
        str_off, str_size = sections[link][4], sections[link][5]
        for j in range(size // 24):
            st_name, st_info, _, st_shndx, st_value, _ = struct.unpack_from("<IBBHQQ", data, off + j * 24)
            if (st_info & 0xF) != _STT_FUNC or st_shndx == 0 or not st_value or st_name >= str_size:
                continue
            start = str_off + st_name
            if data[start:start + len(name) + 1] == name + b"\0":
                return int(st_value)
    return None


def raise_fd_limit(target: int = FD_TARGET) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to ``target`` (or the hard limit, if lower); never lowers it.
    Returns the soft limit after (-1 for unlimited). Never raises: a refusal leaves the limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return -1 if soft == resource.RLIM_INFINITY else int(soft)


def prefer_pread() -> ReadMode:
    """Make this process's LevelDB read table files with ``pread`` rather than ``mmap`` (see the module
    docstring), once; later calls return the first call's outcome. Call it before the first ``plyvel.DB``
    (a call after that has no effect on LevelDB, which has read the limit by then).

    Returns: :attr:`ReadMode.PREAD` when the switch was made, :attr:`ReadMode.MMAP` when it was not
    (``TALLY_LEVELDB_MMAP=1``, or LevelDB's switch was not found: :func:`read_mode_reason` says why). Never
    raises.
    """
    global _mode, _why
    if _mode is not None:
        return _mode
    if os.environ.get(ENV_KEEP_MMAP, "") not in ("", "0"):
        _mode, _why = ReadMode.MMAP, f"{ENV_KEEP_MMAP} is set"
        return _mode
    lib = _mapped_library()
    if lib is None:
        _mode, _why = ReadMode.MMAP, "no libleveldb shared object is mapped into this process"
        return _mode
    off = symbol_offset(lib[0], SYMBOL)
    if off is None:
        _mode, _why = ReadMode.MMAP, f"{lib[0].name} has no symbol table entry for SetReadOnlyMMapLimit"
        return _mode
    raise_fd_limit()
    ctypes.CFUNCTYPE(None, ctypes.c_int)(lib[1] + off)(0)
    _mode, _why = ReadMode.PREAD, f"SetReadOnlyMMapLimit(0) in {lib[0].name}"
    return _mode


def read_mode_reason() -> str:
    """Why :func:`prefer_pread` chose its mode ("" before it ran)."""
    return _why
