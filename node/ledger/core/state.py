"""Ledger state and its pure, deterministic transition ``apply_block(state, block) -> state``.

No I/O, no clock, no randomness: the only entropy is the block hash used as the sampling beacon.

Credit flow for one receipt (all amounts in base units):
  1. inclusion at height h: ``price`` moves from the requester's balance into escrow;
  2. at height h + 1 the block hash is the beacon: the receipt is sampled with probability ``p(worker)``
     (:mod:`node.ledger.core.sampling`) and, if sampled, a committee is drawn (:mod:`node.ledger.core.committee`);
  3. unsampled: after ``challenge_window`` blocks the worker is paid ``price`` from escrow;
  4. sampled: votes arrive; on a > 2/3 **valid** quorum the worker is paid ``price − fee`` and the members who
     voted valid share ``fee = price · committee_fee_bps / 10^4``; on an **invalid** quorum the requester is
     refunded ``price``, the worker's bond is slashed by ``min(bond, slash_amount)``, the members who voted
     invalid share up to ``fee`` of the slash and the rest goes to the treasury. A round with no quorum after
     every vote, or after ``verdict_timeout`` blocks, escalates to a committee twice as large; after
     ``max_rounds`` the receipt settles as unverified (the worker is paid: abstention never penalises it).

The rules live in the ledger's modules (:mod:`node.ledger.core.modules`): the bank
(:mod:`~node.ledger.core.bank`), the receipts and their settlement (:mod:`~node.ledger.core.receipts`), then
each extension. This module holds the state, checks what every transaction shares (its signing domain, its
signatures, its sender's nonce) and dispatches it to its module by type; it imports no capability.

Invariants (tested): total supply (balances + bonds + escrow) is constant; no amount is negative; a receipt,
a verdict and a slash each count once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...encoding import pack
from ...keys import verify_many
from . import valset as valset_mod
from .domain import mismatch
from .genesis import TREASURY, Genesis, Params
from .kv import _DEL, OrderedSet, Table
from .modules import MODULE_OF, MODULES, module_of
from .records import CODECS, MAPS, SETS, Account, ReceiptRecord
from .rows import evolve
from .status import FINAL, INVALID_S, PENDING, SAMPLED, SETTLED, UNVERIFIED, VALID_S
from .tree import EMPTY_ROOT, SEQ_KEY, StateTree, entry_key, leaf_value, memory_tree
from .tx import ABSTAIN, INVALID, VALID, InvalidTx, Tx
from .txbase import _check
from .valset import ValidatorSet


class State:
    """Ledger state after ``height`` blocks. Treat as immutable outside :func:`apply_block`.

    Its maps are :class:`node.ledger.core.kv.Table` s (dict-like, iterated in sorted key order): in memory here, over
    LevelDB once :class:`node.ledger.store.LedgerStore` opens them. :meth:`copy` is O(1) (a copy-on-write
    overlay). The ``open_*`` sets iterate in insertion order (sequence numbers drawn from :attr:`seq`).

    Every module's tables are in :attr:`tables` by name (:data:`node.ledger.core.records.MAPS` and ``SETS``);
    the core's are also attributes: ``accounts`` -> :class:`Account`; ``receipts`` -> :class:`ReceiptRecord`;
    ``sessions``: ``H(worker ‖ session_id)`` -> receipt id; ``open_receipts``: ids of receipts not yet final.
    A module reaches its own sets by :meth:`ordered` (e.g. :func:`node.ledger.core.jobstate.open_jobs`).
    """

    def __init__(self, chain_id: str, params: Params, validators: tuple[bytes, ...], height: int = 0,
                 last_hash: bytes = b"\x00" * 32, seq: int = 0, tables: dict[str, Table[Any, Any]] | None = None,
                 tree: StateTree | None = None, **initial: dict[Any, Any]):
        self.chain_id, self.params, self.validators = chain_id, params, validators
        self.height, self.last_hash, self.seq = height, last_hash, seq
        self.tree = tree  # None: computed from every entry at the first state_root() (node.ledger.core.tree)
        self.archived: list[Any] = []  # history.Append s of the block applied to this copy (stored by the edge)
        # {table: {key: stored bytes}} of this copy's writes, encoded once by state_root() for the root and
        # reused by the store's commit (node.ledger.statedb.stage_state); None until then and after the commit
        self.encoded: dict[str, dict[Any, bytes]] | None = None
        self._parent: tuple[Any, ...] | None = None  # (root, counter) of the state this one was copied from
        self.tables: dict[str, Table[Any, Any]] = dict(tables) if tables else {}
        for name in MAPS + SETS:
            if name not in self.tables:
                vals = initial.pop(name, None) or {}
                if name in SETS:
                    vals = {k: i for i, k in enumerate(vals)}
                    self.seq = max(self.seq, len(vals))
                self.tables[name] = Table.memory(vals)
        if initial:
            raise TypeError(f"unknown state fields {sorted(initial)}")

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # the core's tables (the bank's and the receipts module's); a module reaches its own through ``tables`` and
    # :meth:`ordered` (its accessors: node.ledger.core.jobstate.jobs_of, runstate.runs_of, staking.evidence_of...)
    accounts = property(lambda self: self.tables["accounts"])
    receipts = property(lambda self: self.tables["receipts"])
    sessions = property(lambda self: self.tables["sessions"])
    open_receipts = property(lambda self: OrderedSet(self.tables["open_receipts"], self._next_seq))

    def ordered(self, name: str) -> OrderedSet[bytes]:
        """The insertion-ordered set table ``name`` (one of a module's ``sets``): members iterate in the order
        they were added, each numbered from this state's counter :attr:`seq`.

        Raises:
            KeyError: no set table of that name.
        """
        return OrderedSet(self.tables[name], self._next_seq)

    def copy(self) -> State:
        """A working copy: writes to it leave this state unchanged (O(1): overlays on every table; this
        state's root is computed first, the copy's is computed from its own writes alone)."""
        self.state_root()
        assert self.tree is not None and self.tree.root is not None
        child = State(self.chain_id, self.params, self.validators, self.height, self.last_hash, self.seq,
                      tables={n: t.child() for n, t in self.tables.items()}, tree=self.tree.child())
        child._parent = (self.tree.root, self.seq)
        return child

    def account(self, a: bytes) -> Account:
        acc: Account = self.accounts.get(a, Account())
        return acc

    def supply(self) -> int:
        """Total base units held as balance, bond or escrow by all accounts (the treasury included)."""
        return sum(x.balance + x.bond + x.escrow for x in self.accounts.values())

    def detach(self) -> State:
        """A copy held in memory (O(n)): it stays readable after the store it was read from is closed."""
        self.state_root()
        assert self.tree is not None and self.tree.root is not None
        return State(self.chain_id, self.params, self.validators, self.height, self.last_hash, self.seq,
                     tables={n: Table.memory(dict(t.items())) for n, t in self.tables.items()},
                     tree=StateTree(None, memory_tree().base, self.tree.root))

    def state_root(self) -> bytes:
        """The sparse Merkle root (:mod:`node.ledger.core.tree`) over every entry of every table and the counter:
        O(changes · log n) for a copy (computed once, from its own writes: a state is not changed after its
        root is read), O(n) for a state built without a parent (genesis)."""
        if self.tree is None or (self._parent is None and self.tree.root is None):
            self.tree = self.tree or memory_tree()
            ch: dict[bytes, bytes | None] = {
                entry_key(n, k): leaf_value(CODECS[n].dumps(v)) for n in MAPS + SETS for k, v in self.tables[n].items()}
            ch[SEQ_KEY] = leaf_value(pack(self.seq))
            self.tree.compute(EMPTY_ROOT, self.height, ch)
        elif self.tree.root is None:
            assert self._parent is not None
            proot, pseq = self._parent
            ch = {}
            self.encoded = {}
            for n in MAPS + SETS:
                writes = self.tables[n].writes
                if not writes:
                    continue
                dumps, enc = CODECS[n].dumps, self.encoded.setdefault(n, {})
                for k, v in writes.items():
                    if v is _DEL:
                        ch[entry_key(n, k)] = None
                    else:
                        raw = enc[k] = dumps(v)
                        ch[entry_key(n, k)] = leaf_value(raw)
            if self.seq != pseq:
                ch[SEQ_KEY] = leaf_value(pack(self.seq))
            self.tree.compute(proot, max(self.height, proot.version + 1), ch)
        assert self.tree.root is not None
        return self.tree.root.hash

    def prev_valset(self) -> ValidatorSet:
        """The validator set that signed block ``height`` (whose commit block ``height + 1`` repeats)."""
        if not self.params.min_validator_bond:
            return ValidatorSet.equal(self.validators)
        return valset_mod.set_at(self.tables["validators"], 0)

    def valset(self) -> ValidatorSet:
        """The validator set that signs block ``height + 1`` (:mod:`node.ledger.core.valset`): from the
        ``validators`` table, or the genesis validators with one vote each when genesis ``min_validator_bond``
        is 0. (:attr:`validators` is always the genesis list.)"""
        if not self.params.min_validator_bond:
            return ValidatorSet.equal(self.validators)
        return valset_mod.set_at(self.tables["validators"], 1)

    def next_valset(self) -> ValidatorSet:
        """The validator set that signs block ``height + 2`` (a header's ``next_validators_hash``)."""
        if not self.params.min_validator_bond:
            return ValidatorSet.equal(self.validators)
        return valset_mod.set_at(self.tables["validators"], 2)

    def bond_of(self, account: bytes) -> int:
        """``account``'s bond in base units (its voting power as a validator)."""
        return self.account(account).bond

    @property
    def min_validator_bond(self) -> int:
        return self.params.min_validator_bond

    def eligible(self) -> list[bytes]:
        """Accounts bonded with at least ``min_bond``: workers and committee members."""
        return [a for a, x in self.accounts.items() if x.bond >= self.params.min_bond and a != TREASURY]


def genesis_state(g: Genesis) -> State:
    s = State(chain_id=g.domain, params=g.params, validators=g.validators, last_hash=g.hash)
    for a, bal, bond in g.balances:
        prev = s.account(a)
        s.accounts[a] = replace(prev, balance=prev.balance + bal, bond=prev.bond + bond)
    if g.params.min_validator_bond:
        for a, row in valset_mod.genesis_rows(g.validators, {a: s.bond_of(a) for a in g.validators}).items():
            s.tables["validators"][a] = row
    return s


# ------------------------------------------------------------------ transactions


def presign_check(txs: list[Tx], verified: Callable[[Tx], bool] | None = None) -> set[int]:
    """Verify the signatures of ``txs`` in parallel; the set of indexes whose signatures all verify.

    ``verified``: true for a transaction whose exact signed bytes this node already verified (its mempool's
    admission check, :meth:`node.ledger.mempool.Mempool.verified`); those are not verified again.
    """
    checks = [(i, c) for i, tx in enumerate(txs) if verified is None or not verified(tx)
              for c in tx.signature_checks()]
    ok = verify_many([(a, d, sig) for _, (a, d, sig, _w) in checks])
    bad = {i for (i, _), good in zip(checks, ok, strict=True) if not good}
    return set(range(len(txs))) - bad


def apply_tx(s: State, tx: Tx, signatures_checked: bool = False) -> None:
    """Apply one transaction to the working copy ``s`` in place.

    ``signatures_checked``: the caller already verified every signature (:func:`presign_check`).

    Raises:
        InvalidTx: wrong chain, bad signature, bad nonce, insufficient funds, replay, not a committee member…
            ``s`` is unchanged when this is raised.
    """
    if tx.chain_id != s.chain_id:  # the signing domain: chain id and genesis hash (node.ledger.core.domain)
        raise InvalidTx(mismatch(tx.chain_id, s.chain_id))
    if not signatures_checked:
        tx.check_signatures()
    # transfers, bonds, unbonds and job messages: one per account nonce
    nonced = tx.sender_nonce  # (sender, nonce) of a transaction ordered by its sender's account nonce
    if nonced is not None:
        expected = s.account(nonced[0]).nonce
        _check(nonced[1] == expected, f"bad nonce {nonced[1]}, expected {expected}")
    m = MODULE_OF.get(type(tx)) or module_of(type(tx))  # the dispatch (node.ledger.core.modules), built once
    if m is None:  # pragma: no cover - decode_tx only builds the registered kinds
        raise InvalidTx("unknown transaction")
    m.apply(s, tx)
    if nonced is not None:  # every branch checks before it changes anything: we get here only when tx applied
        acc = s.account(nonced[0])
        s.accounts[nonced[0]] = evolve(acc, nonce=acc.nonce + 1)


def end_block(s: State, height: int, block_hash: bytes) -> None:
    """Per-block work after the transactions, each module's in the tuple's order (:mod:`node.ledger.core.modules`):
    the receipts' (draw samples with this block's hash as the beacon for receipts included in the previous block,
    settle unsampled receipts past the challenge window, escalate or settle committees that timed out), then
    jobs, runs, batches, the history's retirement and the validator set's shift."""
    for m in MODULES:
        m.end_block(s, height, block_hash)


def apply_txs(s: State, txs: list[Tx], verified: Callable[[Tx], bool] | None = None
              ) -> tuple[State, list[Tx], list[tuple[Tx, str]]]:
    """Try ``txs`` in order on a copy of ``s`` (a proposer building a block). ``verified``: as
    :func:`presign_check`.

    Returns the new working state, the accepted transactions and the rejected ones with their reasons.
    """
    w = s.copy()
    ok: list[Tx] = []
    bad: list[tuple[Tx, str]] = []
    signed = presign_check(txs, verified)
    for i, tx in enumerate(txs):  # apply_tx checks everything before it mutates: a rejected tx changes nothing
        try:
            if i not in signed:
                tx.check_signatures()  # raises with the reason
            apply_tx(w, tx, signatures_checked=True)
        except InvalidTx as e:
            bad.append((tx, str(e)))
            continue
        ok.append(tx)
    return w, ok, bad


def apply_block_body(s: State, height: int, block_hash: bytes, txs: list[Tx],
                     verified: Callable[[Tx], bool] | None = None) -> State:
    """Pure transition: a new state after applying ``txs`` as block ``height`` with hash ``block_hash``.
    ``verified``: as :func:`presign_check` (only for a block this node builds from its own mempool; blocks from
    others are verified in full).

    Raises:
        InvalidTx: any transaction does not apply (the whole block is invalid; ``s`` is untouched).
        ValueError: ``height`` is not ``s.height + 1``.
    """
    if height != s.height + 1:
        raise ValueError(f"block {height} does not follow height {s.height}")
    w = s.copy()
    signed = presign_check(txs, verified)
    for i, tx in enumerate(txs):
        if i not in signed:
            tx.check_signatures()  # raises with the reason
        apply_tx(w, tx, signatures_checked=True)
    return finish_block(w, height, block_hash)


def finish_block(w: State, height: int, block_hash: bytes) -> State:
    """The rest of block ``height``'s transition on the working copy ``w`` that its transactions were applied to
    (by :func:`apply_block_body`, or by :func:`apply_txs` when it rejected none): :func:`end_block`, then the
    height and hash. Returns ``w``."""
    end_block(w, height, block_hash)
    w.height = height
    w.last_hash = block_hash
    return w


__all__ = [  # with the names callers import from here (statuses, verdicts, tables)
    "ABSTAIN",
    "FINAL",
    "INVALID",
    "INVALID_S",
    "MAPS",
    "PENDING",
    "SAMPLED",
    "SETS",
    "SETTLED",
    "UNVERIFIED",
    "VALID",
    "VALID_S",
    "Account",
    "ReceiptRecord",
    "State",
    "apply_block_body",
    "apply_tx",
    "apply_txs",
    "end_block",
    "finish_block",
    "genesis_state",
    "presign_check",
]
