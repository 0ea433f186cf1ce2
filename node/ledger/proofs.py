"""Inclusion proofs and a light client (RFC 9162 §2.1.3 audit paths).

A light client trusts only the genesis validator set. Given a header and its commit it checks the > 2/3
precommits (:func:`verify_header`); given a header and a proof it checks that a transaction (a receipt) is in
that block (:func:`verify_tx_proof`), or that an account held a balance, or a receipt had a status and payouts, in
the state that the header commits to — the state after the parent block, as in Tendermint's ``AppHash``
(:func:`verify_account_proof`, :func:`verify_record_proof`: sparse Merkle proofs, :mod:`node.ledger.core.tree`). Nothing else
is trusted: not the node that served the proof.
"""

from __future__ import annotations

from typing import Any

from ..encoding import DecodeError, H, inclusion_proof, pack, unpack, verify_inclusion
from .core.block import Block, Header, InvalidBlock, check_commit
from .core.records import CODECS
from .core.tree import entry_key, leaf_value
from .core.smt import MAX_PROOF_BYTES
from .core.smt import verify as verify_smt
from .core.state import State


def header_to_list(h: Header) -> list:
    return [h.chain_id, *h.fields()]


def header_from_list(x: Any) -> Header:
    """Raises: InvalidBlock for a malformed header."""
    if not (isinstance(x, list) and len(x) == 7):
        raise InvalidBlock("malformed header")
    return Header(*x)


def tx_proof(block: Block, tx_id: bytes) -> dict:
    """Proof that the transaction with ``tx_id`` is in ``block``.

    Raises:
        KeyError: no such transaction in the block.
    """
    leaves = [pack(t.to_wire()) for t in block.txs]
    for i, t in enumerate(block.txs):
        if t.id == tx_id:
            return {"header": header_to_list(block.header), "leaf": leaves[i], "index": i, "size": len(leaves),
                    "path": inclusion_proof(leaves, i)}
    raise KeyError("transaction not in block")


def entry_proof(parent_state: State, header: Header, table: str, key: bytes) -> dict:
    """Proof of entry ``key`` of state table ``table`` (``"accounts"``, ``"receipts"``, ...) in
    ``parent_state``, the state ``header.state_root`` commits to: the entry's stored bytes (``leaf``) and the
    sparse Merkle siblings from the root down (``path``, b"" for an empty subtree; :mod:`node.ledger.core.tree`).

    Raises:
        ValueError: ``parent_state`` is not the state committed by ``header``. KeyError: no such entry.
    """
    if parent_state.state_root() != header.state_root:
        raise ValueError("state does not match the header's state root")
    raw = CODECS[table].dumps(parent_state.tables[table][key])
    siblings, _leaf = parent_state.tree.prove(entry_key(table, key)).to_wire()  # type: ignore[union-attr]
    return {"header": header_to_list(header), "leaf": raw, "index": 0, "size": 0, "path": siblings,
            "tree": "smt", "table": table}


def account_proof(parent_state: State, header: Header, account: bytes) -> dict:
    """:func:`entry_proof` of an account. Raises as :func:`entry_proof`."""
    return entry_proof(parent_state, header, "accounts", account)


def verify_header(header: Header, commit, validators: tuple[bytes, ...]) -> None:
    """Check that > 2/3 of ``validators`` precommitted ``header``. Raises :class:`InvalidBlock` otherwise."""
    check_commit(header.chain_id, header.height, header.hash, commit, validators)


def _check_path(proof: dict, root: bytes) -> bool:
    try:
        return verify_inclusion(proof["leaf"], proof["index"], proof["size"], proof["path"], root)
    except (KeyError, TypeError):
        return False


def verify_tx_proof(proof: dict, header: Header) -> dict | None:
    """The transaction's wire map if ``proof`` shows it in the block of ``header``, else None."""
    if header_from_list(proof.get("header")) != header or not _check_path(proof, header.tx_root):
        return None
    return unpack(proof["leaf"])


def verify_entry_proof(proof: dict, header: Header, table: str, key: bytes) -> bytes | None:
    """The entry's stored bytes if ``proof`` (:func:`entry_proof`) shows them under ``header.state_root`` for
    ``key`` of ``table``, else None (malformed input included: never raises)."""
    try:
        if header_from_list(proof.get("header")) != header or table not in CODECS:
            return None
        raw, path = proof["leaf"], proof["path"]
        if not isinstance(raw, bytes):
            return None
        k = entry_key(table, key)
        lv = leaf_value(raw)
        return raw if verify_smt([path, [k, H(lv)]], header.state_root, k, lv) else None
    except (InvalidBlock, KeyError, TypeError, ValueError, AttributeError):
        return None


def verify_account_proof(proof: dict, header: Header, account: bytes) -> dict | None:
    """``{"balance", "bond", "escrow", "nonce", ...}`` of ``account`` if ``proof`` shows it under
    ``header.state_root``, else None."""
    raw = verify_entry_proof(proof, header, "accounts", account)
    if raw is None:
        return None
    try:
        leaf = unpack(raw)
    except DecodeError:
        return None
    if not (isinstance(leaf, list) and len(leaf) == 6 and all(isinstance(x, int) for x in leaf)):
        return None
    return dict(zip(("balance", "bond", "escrow", "nonce", "valid_run", "slashed"), leaf))


def verify_record_proof(proof: dict, header: Header, receipt_id: bytes) -> dict | None:
    """The receipt's ledger record (status, committee, votes, payouts: :meth:`ReceiptRecord.to_dict`) if
    ``proof`` shows it under ``header.state_root``, else None."""
    raw = verify_entry_proof(proof, header, "receipts", receipt_id)
    if raw is None:
        return None
    try:
        return CODECS["receipts"].loads(raw).to_dict()
    except Exception:  # a verified record this node's code cannot read: report nothing rather than guess
        return None


def verify_state_proof(proof: Any, header: Header, key: bytes, value: bytes | None) -> bool:
    """Whether ``proof`` shows that tree key ``key`` (32 bytes, :func:`node.ledger.core.smt.tree_key`) holds
    ``value`` (None: holds nothing) in the sparse Merkle tree whose root is ``header.state_root``.

    ``proof``: the wire form of :class:`node.ledger.core.smt.Proof` (``[siblings, leaf]``), or those lists packed
    with msgpack (at most :data:`~node.ledger.core.smt.MAX_PROOF_BYTES`). Malformed input gives False, never an
    exception. Check the header itself with :func:`verify_header` first.
    """
    if isinstance(proof, (bytes, bytearray, memoryview)):
        try:
            proof = unpack(proof, max_size=MAX_PROOF_BYTES)
        except DecodeError:
            return False
    return isinstance(header, Header) and verify_smt(proof, header.state_root, key, value)
