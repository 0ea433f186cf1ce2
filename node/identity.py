"""Node identity: one Ed25519 key per node, stored in the data dir with mode 0600.

The same key is the libp2p peer identity and the ledger account. An account is the raw 32-byte Ed25519
public key; people see it as the libp2p peer ID string (base58 of the identity multihash). Every account that
enters from outside (a peer ID string, a transaction field) must be a valid Ed25519 public key
(:func:`is_valid_account`); only the ledger's own hash-derived accounts (the treasury) are not, and no user can
name them.
"""

from __future__ import annotations

import os
from pathlib import Path

from .encoding import H
from .keys import (  # re-exported: the rest of the node names keys through node.identity
    Identity, account_from_str, account_to_str, check_account, is_valid_account, verify, verify_many,
)

__all__ = ["Identity", "KEY_FILE", "KeyFileError", "account_from_str", "account_to_str", "check_account",
           "dev_seed", "is_valid_account", "load_or_create", "verify", "verify_many"]

KEY_FILE = "node_key"


class KeyFileError(RuntimeError):
    """The key file exists but is unreadable, malformed or readable by others."""


def load_or_create(data_dir: Path, seed: bytes | None = None) -> Identity:
    """Load the node key from ``data_dir/node_key``, creating it (mode 0600) if absent.

    ``seed`` is used only when the file does not exist yet (devnet well-known keys).

    Raises:
        KeyFileError: the file is malformed or its mode lets others read it.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / KEY_FILE
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise KeyFileError(f"{path} has mode {oct(mode)}; it must be 0600 (chmod 600 {path})")
        raw = path.read_bytes()
        if len(raw) != 32:
            raise KeyFileError(f"{path} must hold a 32-byte Ed25519 seed")
        return Identity.from_seed(raw)
    ident = Identity.from_seed(seed) if seed is not None else Identity.generate()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, ident.seed)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return ident


def dev_seed(index: int) -> bytes:
    """Well-known devnet seed ``index`` (like Anvil's dev accounts): public, for the devnet only."""
    return H(b"tally/devnet/dev-account/", str(index).encode())
