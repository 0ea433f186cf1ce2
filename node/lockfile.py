"""Advisory locks on data dirs (``fcntl.flock``, released by the kernel when the holder exits, even on SIGKILL).

A node holds ``<data-dir>/node.lock`` for its whole life, from before it loads its model, so nothing that wipes
data dirs (``node devnet``) can mistake a booting or running node for a stopped one; ``node devnet`` also holds
``<devnet-dir>.lock``. Each lock file holds the holder's pid, for messages.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class LockHeld(RuntimeError):
    """Another process (or another open file in this one) holds the lock; ``pid`` is the text it wrote (``?``
    when unreadable)."""

    def __init__(self, path: Path, pid: str):
        super().__init__(f"{path} is held by pid {pid}")
        self.path, self.pid = path, pid


def hold(path: Path) -> IO[str]:
    """Take the exclusive lock on ``path`` (created if missing) for as long as the returned file stays open.
    Writes our pid into the file.

    Raises:
        LockHeld: somebody else holds it (with the pid they wrote).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 - returned open: holding it holds the lock
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read(32).strip() or "?"
        f.close()
        raise LockHeld(path, pid) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def holder(path: Path) -> str | None:
    """The pid text of whoever holds the lock on ``path``, or None when nobody does (a missing file is not held;
    nothing is created)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
