"""Ed25519 keys and accounts, without any I/O: signing, verification, and the peer-ID form of an account.

The same key is the libp2p peer identity and the ledger account. An account is the raw 32-byte Ed25519
public key; people see it as the libp2p peer ID string (base58 of the identity multihash). Every account that
enters from outside (a peer ID string, a transaction field) must be a valid Ed25519 public key
(:func:`is_valid_account`); only the ledger's own hash-derived accounts (the treasury) are not, and no user can
name them. The ledger's pure core (``node.ledger.core``) imports this module; key files live in
:mod:`node.identity`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import base58
import nacl.bindings
import nacl.exceptions
import nacl.signing


class Identity:
    """An Ed25519 signing key (pynacl). ``account`` is the 32-byte public key."""

    def __init__(self, signing_key: nacl.signing.SigningKey):
        self._sk = signing_key
        self.account: bytes = bytes(signing_key.verify_key)
        # libsodium's 64-byte secret key (seed ‖ public key), for calling crypto_sign without pynacl's wrapper
        # objects: a receipt is signed after every inference step, right after a forward pass has evicted the
        # caches, where each layer of Python costs microseconds
        self._secret = nacl.bindings.crypto_sign_seed_keypair(bytes(signing_key))[1]

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Key from a 32-byte seed."""
        return cls(nacl.signing.SigningKey(seed))

    @classmethod
    def generate(cls) -> Identity:
        return cls(nacl.signing.SigningKey.generate())

    @property
    def seed(self) -> bytes:
        return bytes(self._sk)

    def sign(self, digest: bytes) -> bytes:
        """Sign a 32-byte digest (never a whole payload). Returns the 64-byte signature."""
        if len(digest) != 32:
            raise ValueError("sign 32-byte digests only")
        return nacl.bindings.crypto_sign(digest, self._secret)[:64]  # = self._sk.sign(digest).signature

    @property
    def peer_id(self) -> str:
        return account_to_str(self.account)


def verify(account: bytes, digest: bytes, signature: bytes) -> bool:
    """Check an Ed25519 ``signature`` by ``account`` over a 32-byte ``digest``. Never raises on bad input."""
    if not (isinstance(account, bytes) and len(account) == 32 and isinstance(signature, bytes)
            and len(signature) == 64 and isinstance(digest, bytes) and len(digest) == 32):
        return False
    try:
        nacl.signing.VerifyKey(account).verify(digest, signature)
        return True
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, nacl.exceptions.TypeError):
        return False


_POOL = None


def verify_many(items: list[tuple[bytes, bytes, bytes]]) -> list[bool]:
    """:func:`verify` over many ``(account, digest, signature)`` in parallel threads (pynacl releases the GIL:
    one thread per core). Small batches run inline."""
    global _POOL
    workers = os.cpu_count() or 1
    if len(items) < 64 or workers == 1:
        return [verify(*x) for x in items]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(workers, thread_name_prefix="ed25519")
    step = -(-len(items) // workers)
    chunks = [items[i:i + step] for i in range(0, len(items), step)]
    out: list[bool] = []
    for part in _POOL.map(lambda c: [verify(*x) for x in c], chunks):
        out += part
    return out


# A peer ID of an Ed25519 key is the identity multihash (code 0x00, length 36) of the key's protobuf encoding
# (field 1 KeyType = 1 Ed25519, field 2 Data = the 32 bytes), in base58btc: libp2p specs, peer-ids/peer-ids.md,
# "Peer Ids" and "Keys" (keys of at most 42 bytes are inlined with the identity hash). Written here rather than
# through py-libp2p so that accounts print without importing the network stack (py-libp2p's import takes ~1 s
# and its dependencies do not all install everywhere, e.g. on GPU boxes).
_PEER_ID_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])


@lru_cache(maxsize=1 << 14)
def _is_point(raw: bytes) -> bool:
    return bool(nacl.bindings.crypto_core_ed25519_is_valid_point(raw))


def is_valid_account(raw: object) -> bool:
    """Whether ``raw`` is an account some key can spend from: 32 bytes that are the canonical encoding of a point
    of the Ed25519 curve in its prime-order subgroup and not of small order (libsodium's
    ``crypto_core_ed25519_is_valid_point``). Other 32-byte strings (about 94 % of random ones, and hash-derived
    accounts such as the ledger's treasury) have no secret key: credits sent there are lost.

    Costs ~80 µs per new value (a scalar multiplication); the last 16 384 answers are remembered, since the same
    few accounts appear in most transactions. Never raises.
    """
    return isinstance(raw, bytes) and len(raw) == 32 and _is_point(raw)


def check_account(raw: bytes) -> bytes:
    """Return ``raw`` if it is a valid account (:func:`is_valid_account`).

    Raises:
        ValueError: not 32 bytes, or not a valid Ed25519 public key.
    """
    if not isinstance(raw, bytes) or len(raw) != 32:
        raise ValueError("an account is a 32-byte Ed25519 public key")
    if not _is_point(raw):
        raise ValueError(f"{raw.hex()} is not a valid Ed25519 public key (not a point of the curve's prime-order "
                         "subgroup): no key could ever spend from it")
    return raw


def account_to_str(account: bytes) -> str:
    """The libp2p peer ID string (``12D3KooW...``) of a 32-byte Ed25519 account.

    Raises:
        ValueError: not 32 bytes.
    """
    if not isinstance(account, bytes) or len(account) != 32:
        raise ValueError("an account is a 32-byte Ed25519 public key")
    return base58.b58encode(_PEER_ID_PREFIX + account).decode("ascii")


def account_from_str(text: str) -> bytes:
    """Parse a peer ID string (or 64 hex chars) back into the 32-byte account, which must be a valid Ed25519
    public key (:func:`is_valid_account`): a well-formed peer ID of bytes no key has is refused.

    Raises:
        ValueError: not a peer ID of an Ed25519 key, or its key is not a point of the curve.
    """
    if not isinstance(text, str):
        raise ValueError(f"not a peer ID: {text!r}")
    if len(text) == 64:
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = b""
        if len(raw) == 32:  # fromhex skips whitespace: " ab…ab " would give 31 bytes
            return _checked(raw, text)
    try:
        raw = base58.b58decode(text.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise ValueError(f"not a peer ID: {text!r}") from None
    if len(raw) != len(_PEER_ID_PREFIX) + 32 or not raw.startswith(_PEER_ID_PREFIX):
        raise ValueError(f"not an Ed25519 peer ID: {text!r}")
    return _checked(raw[len(_PEER_ID_PREFIX):], text)


def _checked(raw: bytes, text: str) -> bytes:
    if not _is_point(raw):
        raise ValueError(f"{text} is not a valid Ed25519 public key (its bytes are not a point of the curve's "
                         "prime-order subgroup): no key could ever spend from it")
    return raw
