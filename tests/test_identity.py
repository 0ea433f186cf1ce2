"""Node keys: one Ed25519 key per data dir, mode 0600, peer ID == account."""

from __future__ import annotations

import os

import pytest

from node.identity import (Identity, KeyFileError, account_from_str, account_to_str, dev_seed, load_or_create,
                           verify)


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
