"""Node identity: one Ed25519 key per node, stored in the data dir with mode 0600.

The same key is the libp2p peer identity and the ledger account. An account is the raw 32-byte Ed25519
public key; people see it as the libp2p peer ID string (base58 of the identity multihash). Every account that
enters from outside (a peer ID string, a transaction field) must be a valid Ed25519 public key
(:func:`is_valid_account`); only the ledger's own hash-derived accounts (the treasury) are not, and no user can
name them.

Secret files (this key, the API token) are written by :func:`write_secret` (a fresh temp file opened with
``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600, then linked into place without replacing anything) and read by
:func:`read_secret`, which refuses a file that its group or others may read, with the ``chmod 600`` command that
fixes it (as ssh refuses such a private key). :func:`secure_data_dir` creates the data dir 0700.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from pathlib import Path

from .encoding import H
from .keys import (  # re-exported: the rest of the node names keys through node.identity
    Identity,
    account_from_str,
    account_to_str,
    check_account,
    is_valid_account,
    verify,
    verify_many,
)

__all__ = ["KEY_FILE", "SECRET_DIRS", "TOKEN_FILE", "Identity", "KeyFileError", "account_from_str", "account_to_str",
           "check_account", "dev_seed", "ensure_api_token", "is_valid_account", "load_or_create", "read_secret",
           "secure_data_dir", "verify", "verify_many", "write_secret"]

log = logging.getLogger("tally.node")

KEY_FILE = "node_key"
TOKEN_FILE = "api_token"  # the local API's bearer token, beside the key (ensure_api_token)
MAX_SECRET_BYTES = 4096  # a key or token file is read only this far (both are under 100 bytes)
# Subdirectories of the data dir holding secrets until they are revealed on the ledger: batch result bytes and
# commitment salts (``batch/``), training deltas and job outputs (``blobs/``). The ledger, snapshots and model
# blocks are public.
SECRET_DIRS = ("batch", "blobs")


class KeyFileError(RuntimeError):
    """A secret file (node key, API token) exists but is unreadable, malformed, not a regular file, or readable by
    its group or others (the message gives the ``chmod 600 PATH`` command that fixes the last)."""


def secure_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` with mode 0700 if it does not exist (parents as the umask gives). An existing data dir
    is left as its owner set it, but if its group or others may enter it, a warning names the ``chmod 700``
    command, and the :data:`SECRET_DIRS` in it are created 0700 or tightened to 0700, so what they hold (salts
    and results before their reveal) is never readable by other local users whatever the data dir's mode.

    Raises:
        OSError: the directory cannot be created or tightened.
    """
    data_dir = Path(data_dir)
    if not data_dir.exists():
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        data_dir.mkdir(mode=0o700)
        os.chmod(data_dir, 0o700)  # mkdir's mode is masked by the umask; 0700 needs nothing the umask removes
    mode = stat.S_IMODE(os.stat(data_dir).st_mode)
    if mode & 0o077:
        log.warning("data dir %s has mode %s: other local users can list it; secrets in it are kept in 0600 "
                    "files and 0700 subdirectories, but consider: chmod 700 %s", data_dir, oct(mode), data_dir)
        for name in SECRET_DIRS:
            sub = data_dir / name
            sub.mkdir(mode=0o700, exist_ok=True)
            if stat.S_IMODE(os.lstat(sub).st_mode) != 0o700 and not sub.is_symlink():
                os.chmod(sub, 0o700)


def read_secret(path: Path) -> bytes | None:
    """The bytes of secret file ``path`` (at most :data:`MAX_SECRET_BYTES`), or ``None`` if it does not exist.
    The mode is checked on the opened file (no window between check and read); a symlink is followed, as ssh
    does, but what it leads to must be a regular file of mode 0600 or stricter.

    Raises:
        KeyFileError: not a regular file, larger than the bound, unreadable, or readable by group or others
            (with the ``chmod 600`` command).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO planted here must not hang the start
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KeyFileError(f"{path}: cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise KeyFileError(f"{path} has mode {oct(mode)}; a secret must be 0600 (its group and others may not "
                               f"read it), so the node will not use it. Fix it with: chmod 600 {path}")
        if st.st_size > MAX_SECRET_BYTES:
            raise KeyFileError(f"{path} is {st.st_size} bytes; a key or token file is at most {MAX_SECRET_BYTES}")
        return os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)


def write_secret(path: Path, data: bytes) -> bool:
    """Create secret file ``path`` holding ``data`` with mode 0600, atomically and without following symlinks:
    ``data`` goes into a fresh temp file beside it (``O_CREAT|O_EXCL|O_NOFOLLOW``: a file or symlink planted
    under that name makes this fail rather than write through it), fsynced, then hard-linked to ``path`` (which
    fails if anything, a dangling symlink included, already has that name: nothing is ever replaced) and
    unlinked. Returns ``False`` if ``path`` already existed (another process created it first; read that one).

    Raises:
        OSError: the directory is not writable, or a temp file name is taken.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    moved = False
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as e:  # a file system without hard links: rename (atomic; checked for a name just before)
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if os.path.lexists(path):
                return False
            os.rename(tmp, path)  # would replace a symlink, never write through one
            moved = True
    finally:
        if not moved:
            os.unlink(tmp)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the new name survives a crash
    finally:
        os.close(dfd)
    return True


def load_or_create(data_dir: Path, seed: bytes | None = None) -> Identity:
    """Load the node key from ``data_dir/node_key``, creating it (mode 0600, :func:`write_secret`) if absent; the
    data dir is created 0700 if absent (:func:`secure_data_dir`).

    ``seed`` is used only when the file does not exist yet (devnet well-known keys).

    Raises:
        KeyFileError: the file is malformed, not a regular file, or readable by group or others.
    """
    secure_data_dir(data_dir)
    path = data_dir / KEY_FILE
    for _ in range(2):  # a second read only if another process created the file between our read and write
        raw = read_secret(path)
        if raw is not None:
            if len(raw) != 32:
                raise KeyFileError(f"{path} must hold a 32-byte Ed25519 seed")
            return Identity.from_seed(raw)
        ident = Identity.from_seed(seed) if seed is not None else Identity.generate()
        if write_secret(path, ident.seed):
            return ident
    raise KeyFileError(f"{path}: could not be read or created")


def dev_seed(index: int) -> bytes:
    """Well-known devnet seed ``index`` (like Anvil's dev accounts): public, for the devnet only."""
    return H(b"tally/devnet/dev-account/", str(index).encode())


def ensure_api_token(data_dir: Path) -> str:
    """The node's API token (created once, mode 0600, like Bitcoin Core's cookie file; written and read by
    :func:`node.identity.write_secret` and :func:`node.identity.read_secret`).

    Raises:
        KeyFileError: the token file is readable by group or others (the message has the ``chmod 600`` command),
            not a regular file, not ASCII, or empty.
    """
    path = data_dir / TOKEN_FILE
    for _ in range(2):  # a second read only if another process created the file between our read and write
        raw = read_secret(path)
        if raw is not None:
            try:
                token = raw.decode("ascii").strip()
            except UnicodeDecodeError:
                raise KeyFileError(f"{path} is not an ASCII token; delete it and a new one is made") from None
            if not token:
                raise KeyFileError(f"{path} is empty; delete it and a new one is made")
            return token
        write_secret(path, secrets.token_urlsafe(32).encode())  # then read back (ours, or a racing process's)
    raise KeyFileError(f"{path}: could not be read or created")
