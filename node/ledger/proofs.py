"""Inclusion proofs and a light client (RFC 9162 §2.1.3 audit paths).

A light client trusts only the genesis and follows validator changes header by header, or skips ahead by
bisection (:class:`LightClient`). Given a header, its commit and the set that signed it, it checks the > 2/3
precommits (:func:`verify_header`); given a header and a proof it checks that a transaction (a receipt) is in
that block (:func:`verify_tx_proof`), or that an account held a balance, or a receipt had a status and payouts,
in the state that the header commits to — the state after the parent block, as in Tendermint's ``AppHash``
(:func:`verify_account_proof`, :func:`verify_record_proof`: sparse Merkle proofs, :mod:`node.ledger.core.tree`).
Nothing else is trusted: not the node that served the proof.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..encoding import DecodeError, H, inclusion_proof, pack, unpack, verify_inclusion
from ..keys import verify
from .core.block import Block, Header, InvalidBlock, check_commit, precommit_digest
from .core.history import HEAD_KEY, SUMMARY_FIELDS, LogHead, NodeReader, inclusion_path, read_head
from .core.records import CODECS
from .core.smt import MAX_PROOF_BYTES, verify as verify_smt
from .core.state import State, genesis_state
from .core.tree import entry_key, leaf_value
from .core.valset import ValidatorSet, ValidatorSetError

if TYPE_CHECKING:  # (annotations only)
    from .core.genesis import Genesis
    from .store import LedgerStore


def header_to_list(h: Header) -> list[Any]:
    """The wire list of header ``h``: ``[chain id, *fields]`` (:func:`header_from_list` reads it back)."""
    return [h.chain_id, *h.fields()]


def header_from_list(x: Any) -> Header:
    """Raises: InvalidBlock for a malformed header."""
    if not (isinstance(x, list) and len(x) in (7, 9)):  # 9: with validator hashes (node.ledger.core.valset)
        raise InvalidBlock("malformed header")
    if not (isinstance(x[0], str) and all(isinstance(v, int) for v in (x[1], x[3]))
            and all(isinstance(v, bytes) and len(v) == 32 for v in (x[2], *x[4:]))):
        raise InvalidBlock("malformed header")
    return Header(*x)


def tx_proof(block: Block, tx_id: bytes) -> dict[str, Any]:
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


def entry_proof(parent_state: State, header: Header, table: str, key: bytes) -> dict[str, Any]:
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


def account_proof(parent_state: State, header: Header, account: bytes) -> dict[str, Any]:
    """:func:`entry_proof` of an account. Raises as :func:`entry_proof`."""
    return entry_proof(parent_state, header, "accounts", account)


def verify_header(header: Header, commit: Any, validators: tuple[bytes, ...] | ValidatorSet) -> None:
    """Check that more than 2/3 of the voting power of ``validators`` precommitted ``header``, and, for a header
    that names its validator set (``validators_hash``), that ``validators`` is that set.

    Raises:
        InvalidBlock: another set, or not enough valid precommits.
    """
    vs = validators if isinstance(validators, ValidatorSet) else ValidatorSet.equal(validators)
    if header.validators_hash and vs.hash != header.validators_hash:
        raise InvalidBlock(f"the validator set supplied for header {header.height} is not the one it names")
    check_commit(header.chain_id, header.height, header.hash, commit, vs)


class LightClient:
    """Follows a chain header by header from its genesis, trusting nothing but the genesis: CometBFT light
    client *sequential verification* (spec/light-client/verification, "sequential"). The commit of header
    ``h + 1`` is checked against the validator set supplied with it, and that set against the hash the trusted
    header ``h`` names in ``next_validators_hash`` (and header ``h + 1`` in ``validators_hash``); header ``h + 1``
    must also link to ``h`` by ``prev_hash``. On a chain whose set is fixed in genesis (headers without hashes)
    every header is checked against the genesis validators.

    Attributes: ``height`` and ``header`` (None at genesis) of the last verified header, ``next_hash`` the hash
    of the set that signs the next height, ``valset`` the last set that verified a header.
    """

    def __init__(self, genesis: Genesis) -> None:
        gs = genesis_state(genesis)
        self.chain_id = genesis.domain  # the signing domain: chain id and genesis hash (core.domain)
        self.fixed = not genesis.params.min_validator_bond
        self.height, self.hash = 0, genesis.hash
        self.header: Header | None = None
        self.valset = gs.valset()
        self.next_hash = gs.valset().hash

    def update(self, header: Header, commit: Any, valset: ValidatorSet | None) -> None:
        """Verify ``header`` (height :attr:`height` + 1) with its ``commit`` and the set ``valset`` that signed
        it (ignored on a genesis-fixed chain), and trust it.

        Raises:
            InvalidBlock: another chain, not the next height, not linked to the trusted header, the set is not
                the one the trusted header named, or the commit lacks more than 2/3 of its power. Nothing
                changes when raised.
        """
        if header.chain_id != self.chain_id:
            raise InvalidBlock(f"header of chain {header.chain_id!r}")
        if header.height != self.height + 1:
            raise InvalidBlock(f"header {header.height} does not follow the trusted height {self.height}")
        if header.prev_hash != self.hash:
            raise InvalidBlock(f"header {header.height} does not link to the trusted header")
        if self.fixed:
            if header.validators_hash:
                raise InvalidBlock("a header naming a validator set on a chain whose set is fixed in genesis")
            vs = self.valset
        else:
            if valset is None or valset.hash != self.next_hash:
                raise InvalidBlock(f"the validator set supplied for height {header.height} is not the one the "
                                   f"trusted header {self.height} named")
            if not header.next_validators_hash:
                raise InvalidBlock(f"header {header.height} names no validator set")
            vs = valset
        verify_header(header, commit, vs)
        self.height, self.hash, self.header, self.valset = header.height, header.hash, header, vs
        if not self.fixed:
            self.next_hash = header.next_validators_hash

    def follow(self, items: Any) -> None:
        """:meth:`update` with each ``(header, commit, valset)`` of ``items`` in order (the first bad one
        raises, the ones before it stay trusted)."""
        for header, commit, valset in items:
            self.update(header, commit, valset)

    def skip(self, header: Header, commit: Any, valset: ValidatorSet | None) -> None:
        """Trust ``header`` at any height above :attr:`height` without the headers between: CometBFT's
        *skipping verification* (spec/light-client/verification, ``VerifyNonAdjacent``, trust level 1/3). The
        commit must hold more than 2/3 of the power of the set the header names (``valset``), and signers with
        more than 1/3 of the power of the trusted set (:attr:`valset`, the set that signed the trusted header:
        under the light client's assumption that it has less than 1/3 faulty power, one honest validator of it
        vouches for the header). Adjacent heights go to :meth:`update`. There is no trusting period (headers
        carry proposer time, not a clock this client trusts): a light client should re-sync from a recent
        header it trusts after long offline periods.

        Raises:
            NotEnoughTrust: the trusted set's signers have at most 1/3 of its power (verify a header between
                first: :meth:`verify_to` does). Nothing changes.
            InvalidBlock: another chain, a height not above the trusted one, time not after it, the set is not
                the one the header names, the commit lacks more than 2/3 of its power. Nothing changes.
        """
        if header.chain_id != self.chain_id:
            raise InvalidBlock(f"header of chain {header.chain_id!r}")
        if header.height <= self.height:
            raise InvalidBlock(f"header {header.height} is not above the trusted height {self.height}")
        if header.height == self.height + 1:
            self.update(header, commit, valset)
            return
        if self.header is not None and header.time_ms <= self.header.time_ms:
            raise InvalidBlock(f"header {header.height} is not later than the trusted header")
        if self.fixed:
            vs = self.valset
            verify_header(header, commit, vs)  # every header is signed by the genesis set
        else:
            if valset is None or not header.validators_hash or not header.next_validators_hash:
                raise InvalidBlock(f"header {header.height} names no validator set")
            vs = valset
            verify_header(header, commit, vs)
            trusted = self.valset
            power = trusted.power_of(commit_signers(header, commit, trusted))
            if 3 * power <= trusted.total:
                raise NotEnoughTrust(f"signers of header {header.height} hold {power} of the trusted set's "
                                     f"{trusted.total} power (more than 1/3 needed)")
        self.height, self.hash, self.header, self.valset = header.height, header.hash, header, vs
        if not self.fixed:
            self.next_hash = header.next_validators_hash

    def verify_to(self, height: int, fetch: Any, max_fetches: int = 256) -> int:
        """Trust the header at ``height`` by bisection (CometBFT light client, "bisection"): :meth:`skip` to
        it, and where the trusted set's signers are too few, to the height half way first, recursively.
        ``fetch(h)`` returns ``(header, commit, valset)`` of height ``h`` (e.g. :func:`parse_light_block` of a
        peer's ``/v1/light/{h}``). Returns the number of light blocks fetched: about log2 of the distance
        when the set changes slowly, at most the distance.

        Raises:
            InvalidBlock: a fetched light block fails (nothing after the last verified one is trusted), or more
                than ``max_fetches`` light blocks were needed.
            ValueError: ``height`` not above the trusted height.
        """
        if height <= self.height:
            raise ValueError(f"height {height} is not above the trusted height {self.height}")
        fetched: dict[int, tuple[Header, Any, ValidatorSet | None]] = {}
        pending = [height]
        while pending:
            target = pending[-1]
            if target not in fetched:
                if len(fetched) >= max_fetches:
                    raise InvalidBlock(f"more than {max_fetches} light blocks needed to reach height {height}")
                fetched[target] = fetch(target)
                if fetched[target][0].height != target:
                    raise InvalidBlock(f"asked for the light block of height {target}, got "
                                       f"{fetched[target][0].height}")
            try:
                self.skip(*fetched[target])
                pending.pop()
            except NotEnoughTrust:
                pending.append((self.height + target) // 2)  # > self.height + 1 here: adjacent never raises it
        return len(fetched)


class NotEnoughTrust(InvalidBlock):
    """Skipping verification: the trusted set's signers of a header hold at most 1/3 of its power."""


def commit_signers(header: Header, commit: Any, among: ValidatorSet) -> set[bytes]:
    """Accounts of ``among`` with a valid precommit for ``header`` in ``commit`` (malformed entries ignored)."""
    out: set[bytes] = set()
    for item in commit if isinstance(commit, (list, tuple)) else ():
        if not (isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[1], int)):
            continue
        v, r, sig = item
        if isinstance(v, bytes) and v in among and v not in out and isinstance(sig, bytes) and verify(
                v, precommit_digest(header.chain_id, header.height, r, header.hash), sig):
            out.add(v)
    return out


def light_block(store: LedgerStore, height: int) -> dict[str, Any]:
    """What a light client needs of ``height`` (:class:`LightClient`): ``{"header": header list, "commit":
    [[validator, round, sig], ...], "validators": [[account, power], ...]}``, from a
    :class:`node.ledger.store.LedgerStore`.

    Raises:
        KeyError: the block is not stored here (pruned, below a state-sync base, or beyond the head).
    """
    raw = store.get_block_raw(height)
    if raw is None:
        raise KeyError(f"block {height} is not stored here")
    return {"header": raw["b"]["h"], "commit": raw["c"], "validators": store.valset_at(height).to_wire()}


def parse_light_block(x: Any) -> tuple[Header, Any, ValidatorSet]:
    """A :func:`light_block` dict as :meth:`LightClient.update` takes it.

    Raises:
        InvalidBlock: malformed.
    """
    try:
        return header_from_list(x["header"]), x["commit"], ValidatorSet.from_wire(x["validators"])
    except (KeyError, TypeError, ValidatorSetError) as e:
        raise InvalidBlock(f"malformed light block: {e}") from None


def _check_path(proof: dict[str, Any], root: bytes) -> bool:
    try:
        return verify_inclusion(proof["leaf"], proof["index"], proof["size"], proof["path"], root)
    except (KeyError, TypeError):
        return False


def verify_tx_proof(proof: dict[str, Any], header: Header) -> dict[Any, Any] | None:
    """The transaction's wire map if ``proof`` shows it in the block of ``header``, else None."""
    if header_from_list(proof.get("header")) != header or not _check_path(proof, header.tx_root):
        return None
    wire: dict[Any, Any] = unpack(proof["leaf"])  # a leaf under the header's tx root: a transaction's map
    return wire


def verify_entry_proof(proof: dict[str, Any], header: Header, table: str, key: bytes) -> bytes | None:
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


def verify_account_proof(proof: dict[str, Any], header: Header, account: bytes) -> dict[str, int] | None:
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
    return dict(zip(("balance", "bond", "escrow", "nonce", "valid_run", "slashed"), leaf, strict=True))


def verify_record_proof(proof: dict[str, Any], header: Header, receipt_id: bytes) -> dict[str, Any] | None:
    """The receipt's ledger record (status, committee, votes, payouts: :meth:`ReceiptRecord.to_dict`) if
    ``proof`` shows it under ``header.state_root``, else None."""
    raw = verify_entry_proof(proof, header, "receipts", receipt_id)
    if raw is None:
        return None
    try:
        record: dict[str, Any] = CODECS["receipts"].loads(raw).to_dict()
        return record
    except Exception:  # noqa: BLE001 - a verified record this node's code cannot read: report nothing rather than guess
        return None


def verify_state_proof(proof: Any, header: Header, key: bytes, value: bytes | None) -> bool:
    """Whether ``proof`` shows that tree key ``key`` (32 bytes, :func:`node.ledger.core.smtnode.tree_key`) holds
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


# ------------------------------------------------------------------ receipts that left the state (history log)

def history_proof(parent_state: State, header: Header, nodes: NodeReader, receipt_id: bytes, index: int,
                  data: bytes) -> dict[str, Any]:
    """Proof that the summary ``data`` of ``receipt_id`` is leaf ``index`` of the history log
    (:mod:`node.ledger.core.history`) whose head is in ``parent_state``, the state ``header.state_root`` commits
    to: ``leaf`` (the summary), ``index``, ``size``, ``path`` (the RFC 9162 audit path to the log root, read from
    ``nodes``) and ``head`` (the :func:`entry_proof` of the log head entry).

    Raises:
        ValueError: ``parent_state`` is not the state of ``header``. KeyError: the log of that state does not hold
        ``index`` yet (the receipt left in a later block). HistoryMissing: a subtree hash is not held here.
    """
    head = read_head(parent_state)
    if index >= head.size:
        raise KeyError("the receipt left the state after the state this header commits to")
    return {"header": header_to_list(header), "leaf": data, "index": index, "size": head.size,
            "path": inclusion_path(nodes, index, head.size), "tree": "rfc9162", "table": "history",
            "receipt_id": receipt_id, "head": entry_proof(parent_state, header, "history", HEAD_KEY)}


def verify_history_proof(proof: dict[str, Any], header: Header, receipt_id: bytes) -> dict[str, Any] | None:
    """The summary of receipt ``receipt_id`` (``{"id", "worker", "requester", "price", "status", "final_height",
    "payouts", ...}``, :data:`node.ledger.core.history.SUMMARY_FIELDS`) if ``proof`` (:func:`history_proof`) shows
    it in the history log whose head (size and root) is an entry of the state under ``header.state_root``, else
    None (malformed input included: never raises). Check the header itself with :func:`verify_header` first."""
    try:
        raw = verify_entry_proof(proof["head"], header, "history", HEAD_KEY)
        if raw is None or header_from_list(proof.get("header")) != header:
            return None
        head = LogHead.from_plain(unpack(raw))
        leaf, index, size, path = proof["leaf"], proof["index"], proof["size"], proof["path"]
        if not (isinstance(leaf, bytes) and isinstance(index, int) and size == head.size
                and isinstance(path, list) and all(isinstance(p, bytes) and len(p) == 32 for p in path)):
            return None
        if not verify_inclusion(leaf, index, size, path, head.root):
            return None
        fields = unpack(leaf)
        if not (isinstance(fields, list) and len(fields) == len(SUMMARY_FIELDS) and fields[0] == b"tally/history/v1"
                and fields[1] == receipt_id):
            return None
        out = dict(zip(SUMMARY_FIELDS[1:], fields[1:], strict=True))
        out["payouts"] = [(bytes(a), int(x)) for a, x in out["payouts"]]
        out["index"] = index
        return out
    except (InvalidBlock, DecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
