"""Blocks, headers and commit certificates.

A header commits to its parent (``prev_hash``), to an RFC 9162 Merkle root over its transactions' wire bytes
(``tx_root``) and, as in Tendermint's ``AppHash``, to the account-state root *after the parent block*
(``state_root``). A block is final once it has a commit: precommit signatures of more than 2/3 of the
validator set, all from one round, over ``H(tag ‖ domain ‖ height ‖ round ‖ block_hash)`` (Tendermint,
arXiv:1807.04938). The next block repeats that commit as ``last_commit``. A commit is a list of
``(validator, round, signature)``. The devnet has one validator whose precommit alone is a commit.

Every ``chain_id`` here (a header's, a vote digest's, a commit's) is the network's signing domain,
``"<chain id>/<genesis hash hex>"`` (:mod:`node.ledger.core.domain`): a header, vote or commit of another genesis
that reuses the chain id hashes differently, so its signatures do not verify here and evidence built from its
votes slashes nobody here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...encoding import merkle_root, object_id, pack
from ...keys import Identity, verify
from .domain import is_domain
from .tx import InvalidTx, Tx, decode_tx
from .txbase import vote_digest
from .valset import ValidatorSet

BLOCK_TAG = b"tally/block/v1"
MAX_TXS_PER_BLOCK = 2000


class InvalidBlock(ValueError):
    """A block or commit that is malformed, mis-linked, or not signed by > 2/3 of the validators."""


@dataclass(frozen=True)
class Header:
    chain_id: str
    height: int
    prev_hash: bytes
    time_ms: int
    proposer: bytes
    tx_root: bytes
    state_root: bytes
    # CometBFT's ValidatorsHash / NextValidatorsHash (node.ledger.core.valset): the set that signs this block and
    # the one that signs the next. Empty on a chain whose set is fixed in genesis: such a header has the six
    # fields (and the hash) it always had.
    validators_hash: bytes = b""
    next_validators_hash: bytes = b""

    def fields(self) -> list[Any]:
        base = [self.height, self.prev_hash, self.time_ms, self.proposer, self.tx_root, self.state_root]
        return base + [self.validators_hash, self.next_validators_hash] if self.validators_hash else base

    @property
    def hash(self) -> bytes:
        return object_id(BLOCK_TAG, self.chain_id, self.fields())


@dataclass(frozen=True)
class Block:
    header: Header
    txs: tuple[Tx, ...]
    last_commit: tuple[tuple[bytes, int, bytes], ...]  # (validator, round, signature) for the parent

    @property
    def hash(self) -> bytes:
        return self.header.hash

    @property
    def height(self) -> int:
        return self.header.height

    def to_wire(self) -> dict[Any, Any]:
        return {"h": [self.header.chain_id, *self.header.fields()],
                "txs": [t.to_wire() for t in self.txs],
                "lc": [list(x) for x in self.last_commit]}


def tx_root(txs: list[Tx] | tuple[Tx, ...]) -> bytes:
    return merkle_root([pack(t.to_wire()) for t in txs])


PROPOSAL_TAG = b"tally/proposal/v1"


def proposal_digest(chain_id: str, height: int, round_: int, block_hash: bytes, valid_round: int) -> bytes:
    """32-byte digest a proposer signs for its proposal (``chain_id``: the signing domain)."""
    return object_id(PROPOSAL_TAG, chain_id, [height, round_, block_hash, valid_round])


def precommit_digest(chain_id: str, height: int, round_: int, block_hash: bytes) -> bytes:
    return vote_digest("precommit", chain_id, height, round_, block_hash)


def sign_commit(ident: Identity, chain_id: str, height: int, block_hash: bytes,
                round_: int = 0) -> tuple[bytes, int, bytes]:
    """One validator's precommit entry ``(validator, round, signature)`` for ``block_hash``."""
    return ident.account, round_, ident.sign(precommit_digest(chain_id, height, round_, block_hash))


def check_commit(chain_id: str, height: int, block_hash: bytes, commit: Any,
                 validators: tuple[bytes, ...] | ValidatorSet) -> None:
    """Raise :class:`InvalidBlock` unless ``commit`` holds valid precommits of more than 2/3 of the voting power
    of ``validators`` (a :class:`~node.ledger.core.valset.ValidatorSet`, or a tuple of accounts with one vote
    each) for ``block_hash`` at ``height``, all from one round. ``commit`` may be anything a peer sent: a value
    that is not a list of ``(bytes, int, bytes)`` raises InvalidBlock, never TypeError; each validator's
    signature is checked once (at most ``len(validators)`` Ed25519 checks, however long the commit)."""
    vs = validators if isinstance(validators, ValidatorSet) else ValidatorSet.equal(validators)
    if not isinstance(commit, (list, tuple)):  # a peer's commit may be any msgpack value: refuse, never raise
        raise InvalidBlock("a commit is a list of (validator, round, signature)")
    signers: set[bytes] = set()
    tried: set[bytes] = set()  # one signature check per validator: a commit repeating one costs no more
    rounds = set()
    for item in commit:
        if not (isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[0], bytes)
                and isinstance(item[1], int) and isinstance(item[2], bytes)):
            raise InvalidBlock("malformed commit entry")
        v, r, sig = item
        rounds.add(r)
        if len(rounds) > 1:
            raise InvalidBlock("commit mixes rounds")
        if v in tried or v not in vs:
            continue
        tried.add(v)
        if verify(v, precommit_digest(chain_id, height, r, block_hash), sig):
            signers.add(v)
    power = vs.power_of(signers)
    if not vs.has_quorum(power):
        raise InvalidBlock(f"commit for height {height} has {len(signers)}/{len(vs)} valid signatures "
                           f"({power} of {vs.total} voting power; more than 2/3 needed)")


def decode_block(obj: Any) -> Block:
    """Build a :class:`Block` from its wire map, checking types and the tx root.

    Raises:
        InvalidBlock: malformed header, transactions or commit; a header whose chain id is not a signing domain.
    """
    try:
        if not isinstance(obj, dict):
            raise InvalidBlock("a block is a map")
        h, txs, lc = obj.get("h"), obj.get("txs"), obj.get("lc")
        if not (isinstance(h, list) and len(h) in (7, 9) and isinstance(txs, list) and isinstance(lc, list)):
            raise InvalidBlock("malformed block")
        if len(txs) > MAX_TXS_PER_BLOCK:
            raise InvalidBlock("too many transactions")
        chain_id, height, prev, t, proposer, troot, sroot = h[:7]
        vals = tuple(h[7:])  # (validators_hash, next_validators_hash), or none on a genesis-fixed set
        if not (isinstance(chain_id, str) and isinstance(height, int) and height >= 1 and isinstance(t, int)
                and all(isinstance(x, bytes) and len(x) == 32 for x in (prev, proposer, troot, sroot, *vals))):
            raise InvalidBlock("malformed header")
        if not is_domain(chain_id):
            raise InvalidBlock(f"block for chain {chain_id[:80]!r} not bound to a genesis (an older version's)")
        header = Header(chain_id, height, prev, t, proposer, troot, sroot, *vals)
        decoded = tuple(decode_tx(x) for x in txs)
        commit = tuple((bytes(v), int(r), bytes(s)) for v, r, s in lc)
    except InvalidTx as e:
        raise InvalidBlock(f"bad transaction in block: {e}") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, InvalidBlock):
            raise
        raise InvalidBlock(f"malformed block: {e}") from None
    if tx_root(decoded) != header.tx_root:
        raise InvalidBlock("tx_root does not match the transactions")
    return Block(header, decoded, commit)
