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

Invariants (tested): total supply (balances + bonds + escrow) is constant; no amount is negative; a receipt,
a verdict and a slash each count once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...encoding import H, pack
from ...keys import verify_many
from . import committee as cm, history as history_mod, valset as valset_mod
from .domain import mismatch
from .genesis import TREASURY, Genesis, Params
from .kv import _DEL, OrderedSet, Table
from .module import LedgerModule, Module, no_force
from .modules import MODULES, RECEIPT_KINDS, module_of
from .records import CODECS, MAPS, SETS, Account, ReceiptRecord
from .sampling import PPM, is_sampled, sampling_ppm
from .status import FINAL, INVALID_S, PENDING, SAMPLED, SETTLED, UNVERIFIED, VALID_S
from .tree import EMPTY_ROOT, SEQ_KEY, StateTree, entry_key, leaf_value, memory_tree
from .tx import ABSTAIN, INVALID, VALID, Bond, Evidence, InvalidTx, Receipt, Transfer, Tx, Unbond, Verdict, Vote
from .txbase import _check
from .valset import ValidatorSet


class State:
    """Ledger state after ``height`` blocks. Treat as immutable outside :func:`apply_block`.

    Its maps are :class:`node.ledger.core.kv.Table` s (dict-like, iterated in sorted key order): in memory here, over
    LevelDB once :class:`node.ledger.store.LedgerStore` opens them. :meth:`copy` is O(1) (a copy-on-write
    overlay). The ``open_*`` sets iterate in insertion order (sequence numbers drawn from :attr:`seq`).

    Maps (keys bytes): ``accounts`` -> :class:`Account`; ``receipts`` -> :class:`ReceiptRecord`; ``evidence``:
    evidence key -> ``(height, slashed)``; ``sessions``: ``H(worker ‖ session_id)`` -> receipt id; ``jobs`` ->
    :class:`node.ledger.core.jobs.Job`; ``runs`` -> :class:`node.ledger.core.runs.Run`. Sets: ids of receipts, jobs and
    runs not yet final.
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

    accounts = property(lambda self: self.tables["accounts"])
    receipts = property(lambda self: self.tables["receipts"])
    evidence = property(lambda self: self.tables["evidence"])
    sessions = property(lambda self: self.tables["sessions"])
    jobs = property(lambda self: self.tables["jobs"])
    runs = property(lambda self: self.tables["runs"])
    open_receipts = property(lambda self: OrderedSet(self.tables["open_receipts"], self._next_seq))
    open_jobs = property(lambda self: OrderedSet(self.tables["open_jobs"], self._next_seq))
    open_runs = property(lambda self: OrderedSet(self.tables["open_runs"], self._next_seq))
    open_batches = property(lambda self: OrderedSet(self.tables["open_batches"], self._next_seq))

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


def _credit(s: State, a: bytes, amount: int) -> None:
    s.accounts[a] = replace(s.account(a), balance=s.account(a).balance + amount)


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
    core = _CORE.get(type(tx))
    if core is not None:
        core(s, tx)
    else:
        m = module_of(type(tx))
        if m is None:  # pragma: no cover - decode_tx only builds the registered kinds
            raise InvalidTx("unknown transaction")
        m.apply(s, tx)
    if nonced is not None:  # every branch checks before it changes anything: we get here only when tx applied
        acc = s.account(nonced[0])
        s.accounts[nonced[0]] = replace(acc, nonce=acc.nonce + 1)


def _apply_transfer(s: State, tx: Transfer) -> None:
    sender = s.account(tx.sender)
    _check(sender.balance >= tx.amount, "insufficient balance")
    _check(tx.recipient != TREASURY, "the treasury cannot receive transfers")
    s.accounts[tx.sender] = replace(sender, balance=sender.balance - tx.amount)
    _credit(s, tx.recipient, tx.amount)


def _apply_bond(s: State, tx: Bond) -> None:
    acc = s.account(tx.sender)
    _check(acc.balance >= tx.amount, "insufficient balance")
    s.accounts[tx.sender] = replace(acc, balance=acc.balance - tx.amount, bond=acc.bond + tx.amount)


def _apply_unbond(s: State, tx: Unbond) -> None:
    """Release bond to balance unless the worker has receipts not final, or a module holds work of it (each
    module's :meth:`~node.ledger.core.module.LedgerModule.unbond_blocker`, in the tuple's order)."""
    acc = s.account(tx.sender)
    _check(acc.bond >= tx.amount, "unbond exceeds the bond")
    _check(not any(s.receipts[r].receipt.worker == tx.sender for r in s.open_receipts),
           "receipts of this worker are still pending; unbond after they are final")
    for m in MODULES:
        why = m.unbond_blocker(s, tx.sender, acc.bond - tx.amount)
        _check(why is None, why or "")
    s.accounts[tx.sender] = replace(acc, balance=acc.balance + tx.amount, bond=acc.bond - tx.amount)


def _apply_receipt(s: State, r: Receipt) -> None:
    p = s.params
    r.check_shape()
    _check(r.id not in s.receipts, "receipt already on the ledger (replay)")
    skey = H(r.worker, r.session_id)
    _check(skey not in s.sessions, "a receipt for this session is already on the ledger (one per worker and session)")
    _check(r.opened_height <= s.height + 1, "receipt opened at a future height")
    _check(r.opened_height + p.receipt_max_age >= s.height, "receipt too old")
    _check(r.price == r.work * p.price_per_token_block,
           f"price must be work × price_per_token_block = {r.work * p.price_per_token_block}")
    _check(r.price <= p.max_receipt_price, "receipt price above max_receipt_price")
    _check(s.account(r.worker).bond >= p.min_bond, "worker is not bonded")
    req = s.account(r.requester)
    _check(req.balance >= r.price, "requester cannot cover the price")
    s.accounts[r.requester] = replace(req, balance=req.balance - r.price, escrow=req.escrow + r.price)
    s.receipts[r.id] = ReceiptRecord(receipt=r, height=s.height + 1)
    s.open_receipts[r.id] = None
    s.sessions[skey] = r.id


def _apply_vote(s: State, v: Vote) -> None:
    rec = s.receipts.get(v.receipt_id)
    _check(rec is not None, "vote for an unknown receipt")
    _check(rec.status == SAMPLED, f"receipt is {rec.status}, not awaiting votes")
    _check(v.round == rec.round, f"vote for round {v.round}, receipt is in round {rec.round}")
    _check(v.voter in rec.committee, "voter is not on this receipt's committee")
    _check(v.voter not in rec.round_votes(), "member already voted in this round")
    rec = replace(rec, votes=rec.votes + ((v.voter, v.round, v.verdict, v.distance_ppm),))
    s.receipts[v.receipt_id] = rec
    verdict = cm.tally(rec.round_votes(), len(rec.committee))
    if verdict is not None:
        _finalize(s, rec, verdict, s.height + 1)


def _apply_evidence(s: State, e: Evidence) -> None:
    _check(e.value_a != e.value_b, "evidence needs two different values")
    _check(e.validator in s.validators or e.validator in s.tables["validators"], "evidence against a non-validator")
    _check(e.key not in s.evidence, "evidence already on the ledger (counted once)")
    _check(e.height <= s.height + 1, "evidence from a future height")
    acc = s.account(e.validator)
    slashed = min(acc.bond, s.params.slash_amount)
    s.accounts[e.validator] = replace(acc, bond=acc.bond - slashed, slashed=acc.slashed + slashed)
    _credit(s, TREASURY, slashed)
    s.evidence[e.key] = (s.height + 1, slashed)


# the core's own kinds (node.ledger.core.txbase.CORE_TXS) -> their rule; every other kind is a module's
_CORE: dict[type[Tx], Callable[[State, Any], None]] = {
    Transfer: _apply_transfer, Bond: _apply_bond, Unbond: _apply_unbond, Receipt: _apply_receipt,
    Vote: _apply_vote, Evidence: _apply_evidence}


# ------------------------------------------------------------------ settlement

def _release_escrow(s: State, r: Receipt) -> None:
    req = s.account(r.requester)
    s.accounts[r.requester] = replace(req, escrow=req.escrow - r.price)


def _finalize(s: State, rec: ReceiptRecord, verdict: Verdict, height: int) -> None:
    r, p = rec.receipt, s.params
    _release_escrow(s, r)
    voters = [m for m, verd in rec.round_votes().items() if verd == verdict]
    payouts: list[tuple[bytes, int]] = []
    slashed = 0
    worker = s.account(r.worker)
    if verdict == VALID:
        fee = r.price * p.committee_fee_bps // 10_000
        share = fee // len(voters)
        for m in voters:
            payouts.append((m, share))
        payouts.append((r.worker, r.price - share * len(voters)))
        s.accounts[r.worker] = replace(worker, valid_run=worker.valid_run + 1)
        status = VALID_S
    else:
        payouts.append((r.requester, r.price))
        slashed = min(worker.bond, p.slash_amount)
        s.accounts[r.worker] = replace(worker, bond=worker.bond - slashed, valid_run=0,
                                       slashed=worker.slashed + slashed)
        reward = min(slashed, r.price * p.committee_fee_bps // 10_000)
        share = reward // len(voters)
        for m in voters:
            payouts.append((m, share))
        payouts.append((TREASURY, slashed - share * len(voters)))
        status = INVALID_S
    owed = 0
    kind = RECEIPT_KINDS.get(type(r))  # a module's receipt: who it pays on this verdict (node.ledger.core.module)
    if kind is not None:
        payouts, owed = kind.split(s, r, verdict, payouts)
    for a, amt in payouts:
        _credit(s, a, amt)
    s.receipts[r.id] = replace(rec, status=status, final_height=height, payouts=tuple(payouts), slashed=slashed)
    s.open_receipts.pop(r.id, None)
    history_mod.schedule_leave(s, s.receipts[r.id])
    if kind is not None:
        kind.finalized(s, r, verdict, owed, height)


def _settle_unchecked(s: State, rec: ReceiptRecord, status: str, height: int) -> None:
    r = rec.receipt
    kind = RECEIPT_KINDS.get(type(r))
    if kind is not None and kind.settle_unchecked(s, rec, status, height):  # settled by its module
        return
    _release_escrow(s, r)
    _credit(s, r.worker, r.price)
    s.receipts[r.id] = replace(rec, status=status, final_height=height, payouts=((r.worker, r.price),))
    s.open_receipts.pop(r.id, None)
    history_mod.schedule_leave(s, s.receipts[r.id])


def end_block(s: State, height: int, block_hash: bytes) -> None:
    """Per-block work after the transactions: draw samples with this block's hash as the beacon for receipts
    included in the previous block, settle unsampled receipts past the challenge window, escalate or settle
    committees that timed out."""
    p = s.params
    for rid in list(s.open_receipts):
        rec = s.receipts[rid]
        kind = RECEIPT_KINDS.get(type(rec.receipt))  # None: an inference receipt (the core's rules alone)
        if kind is not None and kind.sampled_later(rec):
            continue  # sampled by its module (a round receipt: when its round's commit phase closes)
        if rec.status == PENDING and rec.height == height - 1:
            worker = s.account(rec.receipt.worker)
            ppm = sampling_ppm(p.sample_base_ppm, p.sample_floor_ppm, worker.valid_run, p.adapt_step)
            if kind is not None:  # a job may require a higher sampling rate; every aggregate is re-computed
                ppm = kind.sample_ppm(s, rec.receipt, ppm)
            if _forced(s, rid, height):  # e.g. disputed by its requester in an earlier block: always checked
                ppm = PPM
            if is_sampled(block_hash, rid, ppm):
                com = cm.select_committee(block_hash, rid, 0, s.eligible(),
                                          (rec.receipt.worker, rec.receipt.requester), p.committee_size)
                if com:
                    s.receipts[rid] = replace(rec, status=SAMPLED, p_ppm=ppm, committee=com, round_height=height)
                    continue
            s.receipts[rid] = replace(rec, p_ppm=ppm)
        elif rec.status == PENDING and _forced(s, rid, height):  # e.g. a requester's dispute
            com = cm.select_committee(block_hash, rid, 0, s.eligible(),
                                      (rec.receipt.worker, rec.receipt.requester), p.committee_size)
            if com:
                s.receipts[rid] = replace(rec, status=SAMPLED, p_ppm=PPM, committee=com, round_height=height)
            elif rec.height + p.challenge_window <= height:
                _settle_unchecked(s, rec, SETTLED, height)
        elif rec.status == PENDING and rec.height + p.challenge_window <= height:
            _settle_unchecked(s, rec, SETTLED, height)
        elif rec.status == SAMPLED:
            size = len(rec.committee)
            if cm.deadlocked(rec.round_votes(), size) or height - rec.round_height >= p.verdict_timeout:
                nxt = rec.round + 1
                # a member who did not vote in the round that timed out is left out of the next one: an account
                # that is bonded but offline (or withholds its vote) would otherwise sit on every larger committee
                # and, with few eligible accounts, keep any quorum out of reach
                silent = set(rec.committee) - set(rec.round_votes())
                com = cm.select_committee(block_hash, rid, nxt, s.eligible(),
                                          (rec.receipt.worker, rec.receipt.requester, *silent), p.committee_size)
                if nxt >= p.max_rounds or not com:
                    _settle_unchecked(s, rec, UNVERIFIED, height)
                else:
                    s.receipts[rid] = replace(rec, round=nxt, committee=com, round_height=height)
    for m in MODULES:  # the tuple's order (node.ledger.core.modules): jobs, runs, batches, history, staking
        m.end_block(s, height, block_hash)


def _forced(s: State, receipt_id: bytes, height: int) -> bool:
    """Whether a module requires a committee on the pending receipt now (a dispute); asked in the tuple's order,
    the first yes ends the asking."""
    return any(m.forces_check(s, receipt_id, height) for m in _FORCING)


# the modules that may force a committee (the others' forces_check is the default no, not asked on the hot path)
_FORCING: tuple[LedgerModule, ...] = tuple(m for m in MODULES if not (isinstance(m, Module) and m.on_force is no_force))


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


__all__ = [
    "ABSTAIN",
    "FINAL",
    "INVALID",
    "VALID",
    "Account",
    "ReceiptRecord",
    "State",
    "apply_block_body",
    "apply_tx",
    "apply_txs",
    "end_block",
    "finish_block",
    "genesis_state",
]
