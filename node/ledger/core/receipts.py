"""Receipts, the core's ledger module: inference receipts, committee votes, and the settlement every receipt kind
shares (pure; the credit flow is :mod:`node.ledger.core.state`'s docstring).

Inference receipts and votes are this module's kinds. Every receipt on the ledger, whatever its module (a
training receipt, a round receipt, an aggregate), is recorded in its ``receipts`` table, drawn for sampling at
the end of the block after its inclusion with that block's hash as the beacon, voted on by committees, escalated,
and settled here; its module's :class:`~node.ledger.core.module.ReceiptKind` says what differs (its sampling
rate, who is paid on a verdict, what follows when it is final). A module's ``forces_check`` (a dispute) puts a
pending receipt before a committee. Both are handed in by the module tuple (:mod:`node.ledger.core.modules`):
this module imports no capability.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...encoding import H
from . import committee as cm, history as history_mod
from .genesis import TREASURY
from .kv import Codec
from .module import LedgerModule, ReceiptKind, credit, ident
from .params import ParamPart
from .rows import ReceiptRecord, evolve
from .sampling import PPM, is_sampled, sampling_ppm
from .status import FINAL, INVALID_S, PENDING, SAMPLED, SETTLED, UNVERIFIED, VALID_S
from .txbase import VALID, InvalidTx, Receipt, Tx, Verdict, Vote, _check
from .view import StateView

Kinds = Mapping[type[Tx], ReceiptKind]  # a module receipt type -> its rules (none for an inference receipt)


def _apply_receipt(s: StateView, r: Receipt) -> None:
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
    s.accounts[r.requester] = evolve(req, balance=req.balance - r.price, escrow=req.escrow + r.price)
    s.receipts[r.id] = ReceiptRecord(receipt=r, height=s.height + 1)
    s.open_receipts[r.id] = None
    s.sessions[skey] = r.id


def _apply_vote(s: StateView, v: Vote, kinds: Kinds) -> None:
    rec = s.receipts.get(v.receipt_id)
    _check(rec is not None, "vote for an unknown receipt")
    _check(rec.status == SAMPLED, f"receipt is {rec.status}, not awaiting votes")
    _check(v.round == rec.round, f"vote for round {v.round}, receipt is in round {rec.round}")
    _check(v.voter in rec.committee, "voter is not on this receipt's committee")
    _check(v.voter not in rec.round_votes(), "member already voted in this round")
    rec = evolve(rec, votes=rec.votes + ((v.voter, v.round, v.verdict, v.distance_ppm),))
    s.receipts[v.receipt_id] = rec
    verdict = cm.tally(rec.round_votes(), len(rec.committee))
    if verdict is not None:
        _finalize(s, rec, verdict, s.height + 1, kinds)


def _release_escrow(s: StateView, r: Receipt) -> None:
    req = s.account(r.requester)
    s.accounts[r.requester] = evolve(req, escrow=req.escrow - r.price)


def _finalize(s: StateView, rec: ReceiptRecord, verdict: Verdict, height: int, kinds: Kinds) -> None:
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
        s.accounts[r.worker] = evolve(worker, valid_run=worker.valid_run + 1)
        status = VALID_S
    else:
        payouts.append((r.requester, r.price))
        slashed = min(worker.bond, p.slash_amount)
        s.accounts[r.worker] = evolve(worker, bond=worker.bond - slashed, valid_run=0,
                                       slashed=worker.slashed + slashed)
        reward = min(slashed, r.price * p.committee_fee_bps // 10_000)
        share = reward // len(voters)
        for m in voters:
            payouts.append((m, share))
        payouts.append((TREASURY, slashed - share * len(voters)))
        status = INVALID_S
    owed = 0
    kind = kinds.get(type(r))  # a module's receipt: who it pays on this verdict (node.ledger.core.module)
    if kind is not None:
        payouts, owed = kind.split(s, r, verdict, payouts)
    for a, amt in payouts:
        credit(s, a, amt)
    s.receipts[r.id] = evolve(rec, status=status, final_height=height, payouts=tuple(payouts), slashed=slashed)
    s.open_receipts.pop(r.id, None)
    history_mod.schedule_leave(s, s.receipts[r.id], kind)
    if kind is not None:
        kind.finalized(s, r, verdict, owed, height)


def _settle_unchecked(s: StateView, rec: ReceiptRecord, status: str, height: int, kinds: Kinds) -> None:
    r = rec.receipt
    kind = kinds.get(type(r))
    if kind is not None and kind.settle_unchecked(s, rec, status, height):  # settled by its module
        return
    _release_escrow(s, r)
    credit(s, r.worker, r.price)
    s.receipts[r.id] = evolve(rec, status=status, final_height=height, payouts=((r.worker, r.price),))
    s.open_receipts.pop(r.id, None)
    history_mod.schedule_leave(s, s.receipts[r.id], kind)


class _Eligible:
    """The bonded accounts committees are drawn from, read once per end-block as a sorted tuple (reading them is
    O(accounts); per sampled receipt it was the block's largest cost at thousands of accounts) and read again only
    after a module's own settlement ran, the one step of this loop that may change a bond."""

    def __init__(self, s: StateView):
        self.s = s
        self.pool: tuple[bytes, ...] | None = None

    def get(self) -> tuple[bytes, ...]:
        if self.pool is None:
            self.pool = tuple(sorted(self.s.eligible()))
        return self.pool

    def changed(self, kind: ReceiptKind | None) -> None:
        if kind is not None:  # an inference receipt's own settlement credits a balance, never a bond
            self.pool = None


def end_block(s: StateView, height: int, block_hash: bytes, kinds: Kinds, forcing: tuple[LedgerModule, ...]) -> None:
    """Per-block work after the transactions: draw samples with this block's hash as the beacon for receipts
    included in the previous block, settle unsampled receipts past the challenge window, escalate or settle
    committees that timed out."""
    p = s.params
    pool = _Eligible(s)
    for rid in list(s.open_receipts):
        rec = s.receipts[rid]
        kind = kinds.get(type(rec.receipt))  # None: an inference receipt (the core's rules alone)
        if kind is not None and kind.sampled_later(rec):
            continue  # sampled by its module (a round receipt: when its round's commit phase closes)
        if rec.status == PENDING and rec.height == height - 1:
            worker = s.account(rec.receipt.worker)
            ppm = sampling_ppm(p.sample_base_ppm, p.sample_floor_ppm, worker.valid_run, p.adapt_step)
            if kind is not None:  # a job may require a higher sampling rate; every aggregate is re-computed
                ppm = kind.sample_ppm(s, rec.receipt, ppm)
            if _forced(s, rid, height, forcing):  # e.g. disputed by its requester in an earlier block: always checked
                ppm = PPM
            if is_sampled(block_hash, rid, ppm):
                com = cm.select_committee(block_hash, rid, 0, pool.get(),
                                          (rec.receipt.worker, rec.receipt.requester), p.committee_size)
                if com:
                    s.receipts[rid] = evolve(rec, status=SAMPLED, p_ppm=ppm, committee=com, round_height=height)
                    continue
            s.receipts[rid] = evolve(rec, p_ppm=ppm)
        elif rec.status == PENDING and _forced(s, rid, height, forcing):  # e.g. a requester's dispute
            com = cm.select_committee(block_hash, rid, 0, pool.get(),
                                      (rec.receipt.worker, rec.receipt.requester), p.committee_size)
            if com:
                s.receipts[rid] = evolve(rec, status=SAMPLED, p_ppm=PPM, committee=com, round_height=height)
            elif rec.height + p.challenge_window <= height:
                _settle_unchecked(s, rec, SETTLED, height, kinds)
                pool.changed(kind)
        elif rec.status == PENDING and rec.height + p.challenge_window <= height:
            _settle_unchecked(s, rec, SETTLED, height, kinds)
            pool.changed(kind)
        elif rec.status == SAMPLED:
            size = len(rec.committee)
            if cm.deadlocked(rec.round_votes(), size) or height - rec.round_height >= p.verdict_timeout:
                nxt = rec.round + 1
                # a member who did not vote in the round that timed out is left out of the next one: an account
                # that is bonded but offline (or withholds its vote) would otherwise sit on every larger committee
                # and, with few eligible accounts, keep any quorum out of reach
                silent = set(rec.committee) - set(rec.round_votes())
                com = cm.select_committee(block_hash, rid, nxt, pool.get(),
                                          (rec.receipt.worker, rec.receipt.requester, *silent), p.committee_size)
                if nxt >= p.max_rounds or not com:
                    _settle_unchecked(s, rec, UNVERIFIED, height, kinds)
                    pool.changed(kind)
                else:
                    s.receipts[rid] = evolve(rec, round=nxt, committee=com, round_height=height)



def _forced(s: StateView, receipt_id: bytes, height: int, forcing: tuple[LedgerModule, ...]) -> bool:
    """Whether a module requires a committee on the pending receipt now (a dispute); asked in the tuple's order,
    the first yes ends the asking."""
    return any(m.forces_check(s, receipt_id, height) for m in forcing)


class Receipts:
    """The receipts module (a :class:`~node.ledger.core.module.LedgerModule`): kinds :class:`Receipt` and
    :class:`Vote`; tables ``receipts`` (id -> :class:`ReceiptRecord`), ``sessions`` (``H(worker ‖ session id)``
    -> receipt id) and the set ``open_receipts``.

    Args:
        modules: the other modules, in the tuple's order: their receipt kinds' rules and their forced committees.
    """

    name = "receipts"
    txs: tuple[type[Tx], ...] = (Receipt, Vote)
    maps: Mapping[str, Any] = {"receipts": ReceiptRecord, "sessions": Codec(ident, bytes)}
    sets: tuple[str, ...] = ("open_receipts",)
    store_keys: Mapping[str, bytes] = {"receipts": b"r", "sessions": b"s", "open_receipts": b"o"}
    work_txs: tuple[type[Tx], ...] = (Receipt, Vote)
    params: ParamPart | None = None  # its parameters are the core's (node.ledger.core.params)
    receipt_kinds: Mapping[type[Tx], ReceiptKind] = {}

    def __init__(self, modules: tuple[LedgerModule, ...]):
        self.kinds: dict[type[Tx], ReceiptKind] = {t: k for m in modules for t, k in m.receipt_kinds.items()}
        self.forcing = tuple(m for m in modules if m.may_force)

    @property
    def may_force(self) -> bool:
        return False

    def apply(self, s: StateView, tx: Tx) -> None:
        if isinstance(tx, Receipt):
            _apply_receipt(s, tx)
        elif isinstance(tx, Vote):
            _apply_vote(s, tx, self.kinds)
        else:  # pragma: no cover - the dispatch sends this module its own kinds only
            raise InvalidTx(f"not a receipts transaction: {tx.KIND}")

    def end_block(self, s: StateView, height: int, block_hash: bytes) -> None:
        end_block(s, height, block_hash, self.kinds, self.forcing)

    def height_need(self, s: StateView) -> str | None:
        """``beacon``: a receipt included at the head draws its sample from the next block's hash;
        ``challenge_window``: an unsampled one settles that many blocks after inclusion; ``verdict_timeout``: a
        sampled one's round escalates or settles after that many blocks. A receipt its kind samples later (a
        run's round receipt waiting for its round's commit phase) is its module's to move on."""
        for rid in s.open_receipts:
            rec = s.receipts[rid]
            if rec.status == PENDING:
                kind = self.kinds.get(type(rec.receipt))
                if kind is not None and kind.sampled_later(rec):
                    continue
                return "beacon" if rec.height >= s.height else "challenge_window"
            if rec.status not in FINAL:  # SAMPLED, or a status this module does not know: assume heights move it
                return "verdict_timeout"
        return None

    def unbond_blocker(self, s: StateView, account: bytes, bond_after: int) -> str | None:
        if any(s.receipts[r].receipt.worker == account for r in s.open_receipts):
            return "receipts of this worker are still pending; unbond after they are final"
        return None

    def forces_check(self, s: StateView, receipt_id: bytes, height: int) -> bool:
        return False


__all__ = ["Kinds", "Receipts", "end_block"]
