"""Node keys: one Ed25519 key per data dir, mode 0600, peer ID == account."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys

import pytest

from node.identity import (
    SECRET_DIRS,
    Identity,
    KeyFileError,
    account_from_str,
    account_to_str,
    dev_seed,
    ensure_api_token,
    load_or_create,
    read_secret,
    secure_data_dir,
    verify,
    write_secret,
)


def test_key_created_once_with_mode_0600(tmp_path):
    a = load_or_create(tmp_path)
    assert (os.stat(tmp_path / "node_key").st_mode & 0o777) == 0o600
    b = load_or_create(tmp_path, seed=dev_seed(3))  # an existing key wins over a seed
    assert a.account == b.account


def test_key_readable_by_others_is_refused(tmp_path):
    load_or_create(tmp_path)
    os.chmod(tmp_path / "node_key", 0o644)
    with pytest.raises(KeyFileError, match="0600"):
        load_or_create(tmp_path)


def test_malformed_key_file_is_refused(tmp_path):
    p = tmp_path / "node_key"
    p.write_bytes(b"short")
    os.chmod(p, 0o600)
    with pytest.raises(KeyFileError):
        load_or_create(tmp_path)


def test_peer_id_is_the_account():
    ident = Identity.from_seed(dev_seed(0))
    assert account_from_str(ident.peer_id) == ident.account
    assert account_to_str(ident.account) == ident.peer_id
    assert account_from_str(ident.account.hex()) == ident.account
    with pytest.raises(ValueError):
        account_from_str("not-a-peer-id")


def test_sign_digests_only_and_verify():
    ident = Identity.generate()
    d = b"\x01" * 32
    sig = ident.sign(d)
    assert verify(ident.account, d, sig)
    assert not verify(ident.account, b"\x02" * 32, sig)
    assert not verify(ident.account, d, sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not verify(b"\x00" * 31, d, sig)
    with pytest.raises(ValueError):
        ident.sign(b"a whole payload, not a digest")


def test_peer_id_strings_equal_py_libp2p_both_ways():
    """Our peer ID encoding (identity multihash of the protobuf key, base58btc) against py-libp2p's."""
    from libp2p.crypto.ed25519 import Ed25519PublicKey
    from libp2p.peer.id import ID

    for _ in range(50):
        account = Identity.generate().account
        theirs = ID.from_pubkey(Ed25519PublicKey.from_bytes(account)).to_base58()
        assert account_to_str(account) == theirs
        assert account_from_str(theirs) == account
    rsa_like = ID(b"\x12\x20" + bytes(32)).to_base58()  # a sha256 multihash: a key too big to inline
    for bad in (rsa_like, "", "0OIl", "12D3KooW", "é"):
        with pytest.raises(ValueError):
            account_from_str(bad)
    with pytest.raises(ValueError):
        account_to_str(b"short")
    with pytest.raises(ValueError):  # 64 characters, but fromhex skips the spaces: 31 bytes
        account_from_str(" " + "ab" * 31 + " ")


# --- issue 24 finding 7: secret files written without following symlinks, refused when others may read them ---


def test_secret_files_are_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        load_or_create(tmp_path / "d")
        ensure_api_token(tmp_path / "d")
    finally:
        os.umask(old)
    for name in ("node_key", "api_token"):
        assert stat.S_IMODE(os.stat(tmp_path / "d" / name).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700  # a new data dir is 0700
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["api_token", "node_key"]  # no temp file left


def test_write_secret_never_replaces_nor_writes_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / "node_key").symlink_to(target)  # dangling: an attacker's link to where they could read the key
    with pytest.raises(KeyFileError, match="could not be read or created"):
        load_or_create(d)
    assert not target.exists() and (d / "node_key").is_symlink()  # nothing was written through it
    assert write_secret(d / "token", b"abc") and not write_secret(d / "token", b"xyz")  # never replaced
    assert (d / "token").read_bytes() == b"abc"
    assert sorted(p.name for p in d.iterdir()) == ["node_key", "token"]


def test_group_or_world_readable_secrets_are_refused_with_the_fix(tmp_path):
    ident = load_or_create(tmp_path)
    token = ensure_api_token(tmp_path)
    for name, mode in (("node_key", 0o640), ("node_key", 0o604), ("api_token", 0o644), ("api_token", 0o660)):
        path = tmp_path / name
        os.chmod(path, mode)
        with pytest.raises(KeyFileError) as e:
            (load_or_create if name == "node_key" else ensure_api_token)(tmp_path)
        assert f"chmod 600 {path}" in str(e.value)  # the command that fixes it, as ssh gives
        os.chmod(path, 0o600)
    assert load_or_create(tmp_path).account == ident.account and ensure_api_token(tmp_path) == token
    # a symlink to a readable-by-others file is judged by the file it leads to
    (tmp_path / "real").write_bytes(b"t" * 20)
    os.chmod(tmp_path / "real", 0o644)
    (tmp_path / "api_token").unlink()
    (tmp_path / "api_token").symlink_to(tmp_path / "real")
    with pytest.raises(KeyFileError, match="chmod 600"):
        ensure_api_token(tmp_path)
    os.chmod(tmp_path / "real", 0o600)
    assert ensure_api_token(tmp_path) == "t" * 20


def test_planted_fifo_or_oversized_secret_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "node_key", 0o600)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_or_create(tmp_path)
    p = tmp_path / "api_token"
    p.write_bytes(b"x" * 10_000)
    os.chmod(p, 0o600)
    with pytest.raises(KeyFileError, match="at most 4096"):
        ensure_api_token(tmp_path)
    assert read_secret(tmp_path / "absent") is None


def test_an_open_existing_data_dir_is_warned_about_and_its_secret_dirs_tightened(tmp_path, caplog):
    d = tmp_path / "d"
    d.mkdir()
    os.chmod(d, 0o755)
    (d / "batch").mkdir()
    os.chmod(d / "batch", 0o755)
    with caplog.at_level(logging.WARNING, logger="tally.node"):
        secure_data_dir(d)
    assert f"chmod 700 {d}" in caplog.text
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755  # the owner's choice for the dir itself is kept
    for name in SECRET_DIRS:  # but what holds salts and results before their reveal is closed to others
        assert stat.S_IMODE(os.stat(d / name).st_mode) == 0o700
    caplog.clear()
    os.chmod(d, 0o700)
    with caplog.at_level(logging.WARNING, logger="tally.node"):
        secure_data_dir(d)
    assert not caplog.text


def test_node_start_refuses_a_readable_key_with_the_chmod_command(tmp_path):
    """``node start`` as a process: a key others can read ends it at once with the fix, before anything listens."""
    from node.compute.model import make_tiny

    from .inference.procs import ROOT, write_genesis

    tiny = make_tiny(tmp_path / "models", seed=0)
    gfile = write_genesis(tmp_path, servers=[], clients=[])
    d = tmp_path / "p0"
    load_or_create(d, seed=dev_seed(0))
    for name in ("node_key", "api_token"):
        if name == "api_token":
            ensure_api_token(d)
            os.chmod(d / "node_key", 0o600)
        os.chmod(d / name, 0o644)
        r = subprocess.run([sys.executable, "-m", "node.cli", "start", "--data-dir", str(d), "--model", "tiny",
                            "--model-cache", str(tiny.parent), "--api-port", "0", "--genesis", str(gfile),
                            "--dev-account", "0"], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert r.returncode != 0
        assert f"chmod 600 {d / name}" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr  # one clear line, not a stack
        assert not (d / "node.json").exists() and not (d / "ledger").exists()  # it started nothing
