"""Every account field of every transaction must be a valid Ed25519 public key, checked once when the transaction
is decoded (gossip, blocks, the submit protocol), and every account string (API, genesis) when it is parsed: 32
bytes that no key has are refused, so credits cannot be sent where nothing can spend them. The treasury (a
hash-derived account, not a point) is credited by the state transition itself and is never a transaction's field.
"""

from __future__ import annotations

import json
from importlib import resources

import nacl.bindings
import nacl.exceptions
import pytest
import trio

from node.encoding import H, pack, unpack
from node.identity import Identity, account_from_str, account_to_str, check_account, is_valid_account
from node.ledger.core.block import InvalidBlock, decode_block
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.state import genesis_state
from node.ledger.core.tx import INVALID, TX_KINDS, InvalidTx, Transfer, decode_tx
from node.ledger.genesis import TREASURY, GenesisError, parse_genesis
from node.ledger.service import LedgerService
from node.ledger.store import LedgerStore

from .helpers import CLIENT, KEYS, VALIDATOR, W1, C, make_genesis, make_receipt, vote

P = 2**255 - 19  # the field prime of edwards25519 (RFC 8032, 5.1)


def non_point(tag: bytes = b"") -> bytes:
    """32 bytes, found by hashing, that are not a point of the curve at all (decompression fails)."""
    for i in range(1000):
        raw = H(b"tally/test/non-point/", tag, str(i).encode())
        try:
            nacl.bindings.crypto_core_ed25519_add(raw, raw)  # decompresses both operands
        except nacl.exceptions.CryptoError:  # libsodium could not decompress an operand
            assert not nacl.bindings.crypto_core_ed25519_is_valid_point(raw)
            return raw
    raise AssertionError("no 32-byte string off the curve among 1000 hashes")  # ~half of all strings are off it


def bad_accounts() -> dict[str, bytes]:
    """One 32-byte string of each kind that no key can sign for."""
    real = KEYS[5].account
    order4 = bytes(32)  # y = 0: a point of order 4
    return {
        "off the curve": non_point(),
        "identity (order 1)": (1).to_bytes(32, "little"),
        "order 2": (P - 1).to_bytes(32, "little"),
        "order 4": order4,
        "non-canonical y >= p": (P + 1).to_bytes(32, "little"),
        "identity with the sign bit": bytes([1] + [0] * 30 + [0x80]),
        "mixed order (key + torsion)": nacl.bindings.crypto_core_ed25519_add(real, order4),
        "treasury (hash-derived)": TREASURY,
    }


BAD = bad_accounts()


def test_real_keys_are_valid_and_every_bad_kind_is_not():
    for i in range(20):
        assert is_valid_account(Identity.from_seed(H(b"k", bytes([i]))).account)
    for what, raw in BAD.items():
        assert len(raw) == 32 and not is_valid_account(raw), what
        with pytest.raises(ValueError, match="not a valid Ed25519 public key"):
            check_account(raw)
    for junk in (b"", b"\x01" * 31, b"\x01" * 33, "ab" * 32, None, 5):
        assert not is_valid_account(junk)


@pytest.mark.parametrize("what", sorted(BAD))
def test_peer_id_and_hex_of_a_non_point_are_refused(what):
    raw = BAD[what]
    peer = account_to_str(raw)  # the right prefix and length: only the bytes are wrong
    assert peer.startswith("12D3KooW") and len(peer) == 52
    for text in (peer, raw.hex(), raw.hex().upper()):
        with pytest.raises(ValueError, match="not a valid Ed25519 public key"):
            account_from_str(text)
    good = KEYS[3]
    assert account_from_str(good.peer_id) == account_from_str(good.account.hex()) == good.account


def _valid_value(kind: str, account: bytes):
    return {"int": 1, "amount": 1, "account": account, "bytes32": b"x" * 32, "bytes16": b"j" * 16, "str": "none",
            "verdict": 0, "votekind": "prevote", "value": b"", "sig": b"s" * 64, "text": "q_proj",
            "sint": 0, "accounts": [account], "record": [b"x", 1, "s"], "records": [], "hashes": [b"h" * 32]}[kind]


ACCOUNT_NAMES = {"sender", "recipient", "worker", "requester", "voter", "validator", "sponsor", "aggregator"}


@pytest.mark.parametrize("kind", sorted(TX_KINDS))
def test_every_account_field_of_every_kind_is_checked_at_decode(kind):
    cls = TX_KINDS[kind]
    names = [n for n, k in cls.SCHEMA.items() if k == "account"]
    # every field that names an account is of the checked kind (a new kind with a raw bytes32 account fails here)
    assert {n for n in cls.SCHEMA if n in ACCOUNT_NAMES} == set(names) and names, cls.SCHEMA
    good = [_valid_value(k, KEYS[1].account) for k in cls.SCHEMA.values()]
    wire = {"t": kind, "c": make_genesis().domain, "f": good, "s": [b""] * len(cls.SIGS)}
    assert kind == decode_tx(wire).KIND  # the well-formed one decodes
    for name in names:
        i = list(cls.SCHEMA).index(name)
        for _what, raw in BAD.items():
            f = list(good)
            f[i] = raw
            with pytest.raises(InvalidTx, match=f"'{name}' is not a valid Ed25519 public key"):
                decode_tx(unpack(pack({**wire, "f": f})))  # as it arrives over gossip


def _bad_transfer(g, to: bytes) -> Transfer:
    """A transfer signed by a funded key, built in-process (bypassing the API and the decoder)."""
    return Transfer(g.domain, CLIENT.account, to, 5 * C, 0).signed(CLIENT)


def test_a_block_carrying_a_transfer_to_a_non_point_is_invalid(tmp_path):
    g = make_genesis()
    s0 = genesis_state(g)
    bad = _bad_transfer(g, BAD["off the curve"])
    block, _, rejected = propose(s0, [bad], VALIDATOR, 1000, ())  # a proposer that skips the check
    assert not rejected and block.txs == (bad,)
    with pytest.raises(InvalidBlock, match="bad transaction in block: field 'recipient' is not a valid Ed25519"):
        decode_block(unpack(pack(block.to_wire())))
    # a follower's ledger (real LevelDB) receives it with a valid commit and refuses it: nothing moves
    store = LedgerStore(tmp_path / "db", g)
    try:
        follower = LedgerService(store, g, KEYS[6], host=None)
        assert not follower.is_validator
        before = dict(follower.state.accounts)
        wire = {"b": block.to_wire(), "c": [list(x) for x in commit_block(VALIDATOR, block)]}
        with pytest.raises(InvalidBlock, match="not a valid Ed25519 public key"):
            trio.run(follower.apply_remote, wire)
        assert follower.state.height == 0 and store.head == 0 and follower.state.accounts == before
        # the same block with a transfer to a real key is accepted by the same path: the refusal is the recipient
        ok = Transfer(g.domain, CLIENT.account, W1.account, 5 * C, 0).signed(CLIENT)
        good_block, _, rejected = propose(s0, [ok], VALIDATOR, 1000, ())
        assert not rejected
        wire = {"b": good_block.to_wire(), "c": [list(x) for x in commit_block(VALIDATOR, good_block)]}
        assert trio.run(follower.apply_remote, wire) is True
        assert follower.state.height == 1
        assert follower.state.account(W1.account).balance == s0.account(W1.account).balance + 5 * C
    finally:
        store.close()


@pytest.mark.parametrize("what", sorted(BAD))
def test_gossiped_transfer_to_any_non_point_is_refused_at_decode(what):
    g = make_genesis()
    data = pack(_bad_transfer(g, BAD[what]).to_wire())
    with pytest.raises(InvalidTx, match="'recipient' is not a valid Ed25519 public key"):
        decode_tx(unpack(data, max_size=1 << 16))


def test_treasury_still_receives_slashes_and_is_never_a_field():
    """The treasury is no point, yet the state transition credits it (slashes beyond rewards): the check is on
    transaction fields only."""
    def run_blocks(state, *batches):
        for txs in batches:
            _, state, rejected = propose(state, list(txs), VALIDATOR, 0, ())
            assert not rejected, rejected
        return state

    g = make_genesis()
    s = run_blocks(genesis_state(g), [make_receipt(g, W1)], [])  # included, then sampled (p = 1)
    rid = next(iter(s.receipts))
    members = {k.account: k for k in KEYS}
    s = run_blocks(s, [vote(g, rid, members[m], INVALID) for m in s.receipts[rid].committee])
    assert s.account(TREASURY).balance > 0 and s.supply() == g.supply
    with pytest.raises(InvalidTx, match="'recipient' is not a valid"):
        decode_tx(_bad_transfer(g, TREASURY).to_wire())


def test_genesis_accounts_and_validators_must_be_points():
    doc = json.loads(resources.files("genesis").joinpath("devnet.json").read_text())
    parse_genesis(doc)
    bad = account_to_str(BAD["off the curve"])
    for change in ({"validators": [bad]}, {"accounts": [{"account": bad, "balance": "1"}]}):
        with pytest.raises(GenesisError, match="not a valid Ed25519 public key"):
            parse_genesis({**doc, **change})
