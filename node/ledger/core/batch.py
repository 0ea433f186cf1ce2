"""Batch jobs checked by majority vote: the state transition (pure; called from :mod:`node.ledger.core.state`).

BOINC's replication with a quorum (Anderson, "BOINC: A Platform for Volunteer Computing", J. Grid Computing 2020,
§3.4 "Validation" and §5.3 "Adaptive replication"), applied to the seeds' "distributed pre-processing validated by
simple majority voting" (issue 14). Records in :mod:`node.ledger.core.batchstate`, transactions in
:mod:`node.ledger.core.batchtx`, their checks and effects in :mod:`node.ledger.core.batchapply`, the draw, offers,
limits, penalties and money moves they share with the end block (here) in :mod:`node.ledger.core.batchrules`.

**Money** (base units). A post moves :meth:`BatchPost.escrow` ``= N × k × price × (1 + max_reissues)`` from the
requester's balance to its escrow; each item holds ``k × price × (1 + max_reissues)`` of it. When an item is decided
for good (accepted, or refunded after its last attempt), every agreeing worker of the deciding attempt has been paid
``price`` from escrow and the rest of the item's share returns to the requester's balance at once. A dissenting
worker's bond pays ``min(bond, batch_slash)`` and an absent one's ``min(bond, batch_absent_penalty)``, both to the
treasury (as in :mod:`node.ledger.core.jobs`: a requester paid for a worker's fault would gain from posting items
built to fail). Balances + bonds + escrows are therefore constant.

**Opt-in and price floors** (issue 24 finding 2). Batch work is never forced: the candidates of every draw (items,
re-issues and audits) are the bonded accounts with a live :class:`~node.ledger.core.batchtx.BatchOffer` whose
floor per token, times :meth:`BatchPost.tokens`, is at most the post's ``price`` (:func:`.batchrules.takers`). A post is
refused, changing nothing, when its price per token is below genesis ``batch_min_token_price``
(:meth:`Params.batch_token_floor`), when it would bring its requester's items in open batches above genesis
``batch_max_open_items`` (0: :data:`MAX_ITEMS`), or when fewer than ``replication`` opted-in accounts other than
the requester take its price (it could never be drawn). A withdrawn offer stops new draws; what the worker
already holds is decided by the usual rules (done, or absent and re-issued).

**Assignment.** Up to :data:`MAX_ASSIGN_PER_BLOCK` new items per block (over all batches, in posting order) are
assigned in ``end_block`` of a block after the post's, with that block's hash as the beacon: the candidates are the
opted-in bonded accounts able to take the batch's price (above) other than the requester and the workers of the
item's earlier attempts,
ranked by ``H("tally/batch-assign/v1" ‖ beacon ‖ batch ‖ item ‖ attempt ‖ worker)``; the first ``k`` are drawn
(independent draws per item and attempt, distinct within one). Nobody can choose the draw: the beacon is the hash of
a block that did not exist when the post was signed. With fewer than ``k`` candidates the batch waits for workers
(and may still be cancelled while no item is assigned); a re-issue with fewer than ``k`` fresh candidates refunds
its item.

**Adaptive replication** (BOINC §5.3: hosts with a run of valid results get fewer replicas). With genesis
``min_replication`` > 0, each of the first ``k`` drawn whose :class:`WorkerRecord` ``run`` (consecutive quorum
agreements) is at least ``adapt_step`` lowers the item's replication by one, not below ``min(min_replication, k)``;
the first ``k'`` of the ranking are kept and the quorum becomes ``max(k' // 2 + 1, k' − (k − quorum))`` (the same
number of tolerated dissenters, still a strict majority). ``min_replication`` 0 (every genesis before it existed):
always ``k`` and the posted quorum.

**What an observer learns.** The draw is public: every node must check it, so anyone with the state can compute who
holds each item (:func:`assignments_of` is what a worker queries for its own items). The ledger cannot hide it
without private randomness (VRFs). What commit–reveal guarantees is that knowing the others does not help copying:
a commitment hides the result (32-byte random salt), is bound to its worker, batch, item and attempt
(:func:`node.ledger.core.batchtx.commitment`, so a copied commitment cannot be opened by the copier), and reveals are
refused until the item's commit phase is over (its ``commit_window`` blocks have passed, or every drawn worker has
committed). So every commitment is fixed before any result is visible on the chain. What remains is collusion off
the chain by workers who find each other; ``bench/verify.py --batch`` measures how often a colluding pair forms a
majority, and committee sampling of single-replica work is what catches them in the long run.

**Audits** (:mod:`node.ledger.core.batchaudit`): with genesis ``batch_audit_ppm``, a sampled accepted item is re-run
by a committee; an overturning verdict slashes the workers that agreed on it and returns the slash of the dissenters
that were right. **Limits**: with genesis ``batch_max_held``, a worker holding that many undecided assignments
(halved per consecutive absence, :func:`.batchrules.held_limit`) is not drawn for more; a re-issue falls back to
every fresh worker rather than refund an item for lack of their capacity.

**Decision.** In ``end_block`` of height ``assigned + commit_window + reveal_window``, or of the block in which the
last drawn worker revealed, the item is decided (at most :data:`MAX_DECIDE_PER_BLOCK` per block, earliest first;
the rest wait for the next block): the result hash revealed by at least the item's quorum wins. Its revealers are
paid ``price`` each and their ``agreed`` and ``run`` counts rise; another revealed result slashes its worker
(``batch_slash``, default ``slash_amount``: a wrong result is the offence an invalid receipt verdict punishes);
a worker that committed and did not reveal, or never committed, is not paid and pays ``batch_absent_penalty``
(default ``job_start_penalty``, the ledger's price for holding work and not doing it, capped at half the slash).
The absent penalty is smaller than the slash because a crashed honest worker must not lose like a liar, and not
zero because a worker that sees the others' reveals could otherwise withhold a wrong one for free; withholding still
saves the difference, which is why the slash's size is what deters cheating. An item without a quorum pays nobody
and penalises only the absent; it is re-issued to fresh workers up to ``max_reissues`` times, and then refunded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from . import batchaudit as audit
from .batchapply import apply_batch_tx
from .batchparams import BATCH_PART
from .batchrules import (
    _move_bond,
    _pay,
    _return_bond,
    _set_batch,
    _set_worker,
    _worker,
    absent_penalty_of,
    draw,
    held_limit,
    offers,
    slash_of,
    takers,
)
from .batchstate import (
    TERMINAL,
    AuditStatus,
    Batch,
    BatchStatus,
    Fate,
    Item,
    ItemStatus,
    WorkerRecord,
    due_key,
    item_key,
    open_batches,
)
from .batchtx import BATCH_TXS, BatchAuditVote, BatchCommit, BatchReveal, audit_share, member_pay
from .kv import Codec
from .module import Module, ident
from .view import StateView

MAX_ASSIGN_PER_BLOCK = 64  # new items drawn per block, over all batches
MAX_DECIDE_PER_BLOCK = 64  # items decided (and possibly re-issued) per block, over all batches


def held(s: StateView, worker: bytes) -> int:
    """Assignments of ``worker`` not yet decided (its bond cannot be unbonded while any is)."""
    return _worker(s, worker).held


def reputation(s: StateView, worker: bytes) -> WorkerRecord:
    """``worker``'s batch record: quorum agreements ever, consecutive ones, undecided assignments."""
    return _worker(s, worker)


def assignments_of(s: StateView, worker: bytes) -> list[tuple[bytes, int, int]]:
    """``(batch id, item, attempt)`` of every undecided assignment of ``worker`` (what its worker loop queries).
    O(undecided items of open batches)."""
    out = []
    for bid in open_batches(s):
        b: Batch = s.tables["batches"][bid]
        for i in range(b.assigned):
            it: Item = s.tables["batch_items"][item_key(bid, i)]
            if it.status == ItemStatus.ASSIGNED and worker in it.workers:
                out.append((bid, i, it.attempt))
    return out


def _assign(s: StateView, b: Batch, i: int, attempt: int, height: int, beacon: bytes, eligible: list[bytes],
            exclude: tuple[bytes, ...], limit: bool = True) -> tuple[tuple[bytes, ...], int]:
    """Draw an item's workers among ``eligible`` (the batch's :func:`.batchrules.takers`) but the requester and
    ``exclude``; with ``limit`` (and genesis ``batch_max_held``), only among those below their
    :func:`.batchrules.held_limit`."""
    p, params = b.post, s.params
    cands = [w for w in eligible if w != p.sender and w not in exclude]
    if limit and params.batch_max_held:
        cands = [w for w in cands if (r := _worker(s, w)).held < held_limit(params, r)]
    return draw(beacon, p.batch_id, i, attempt, cands, p.replication, p.quorum, params.min_replication,
                lambda w: params.adapt_step > 0 and _worker(s, w).run >= params.adapt_step)


def _start(s: StateView, b: Batch, i: int, it: Item) -> None:
    for w in it.workers:
        r = _worker(s, w)
        _set_worker(s, w, replace(r, held=r.held + 1))
    s.tables["batch_items"][item_key(b.post.batch_id, i)] = it
    s.tables["batch_due"][due_key(it.due, b.post.batch_id, i)] = 0


def _decide(s: StateView, bid: bytes, i: int, height: int, beacon: bytes, eligible: list[bytes]) -> None:
    b: Batch = s.tables["batches"][bid]
    p = b.post
    it: Item = s.tables["batch_items"][item_key(bid, i)]
    counts = Counter(r for _, r in it.reveals)
    winner = next((r for r, n in counts.items() if n >= it.quorum), None)
    revealed, committed = dict(it.reveals), dict(it.commits)
    history = list(it.history)
    agreed: list[bytes] = []
    for w in it.workers:
        rec = _worker(s, w)
        rec = replace(rec, held=rec.held - 1)
        if winner is not None and revealed.get(w) == winner:
            b = _pay(s, b, w, p.price, refund=False)
            agreed.append(w)
            rec = replace(rec, agreed=rec.agreed + 1, run=rec.run + 1, missed=0)
            history.append((it.attempt, w, Fate.AGREED, p.price))
        elif w in revealed:
            rec = replace(rec, missed=0)
            if winner is None:
                history.append((it.attempt, w, Fate.NO_QUORUM, 0))
            else:
                took = _move_bond(s, w, slash_of(s.params), slash=True)
                b = replace(b, slashed=b.slashed + took)
                rec = replace(rec, run=0)
                history.append((it.attempt, w, Fate.DISSENTED, took))
        else:
            took = _move_bond(s, w, absent_penalty_of(s.params), slash=False)
            b = replace(b, slashed=b.slashed + took)
            rec = replace(rec, run=0, missed=rec.missed + 1)
            history.append((it.attempt, w, Fate.UNREVEALED if w in committed else Fate.ABSENT, took))
        _set_worker(s, w, rec)
    it = replace(it, history=tuple(history))
    if winner is None and it.attempt < p.max_reissues:  # re-issued among the opted-in takers only
        tried = it.tried + it.workers
        workers, quorum = _assign(s, b, i, it.attempt + 1, height, beacon, eligible, tried)
        if not workers:  # a re-issue is refunded only for lack of fresh workers, not of their capacity
            workers, quorum = _assign(s, b, i, it.attempt + 1, height, beacon, eligible, tried, limit=False)
        if workers:
            s.tables["batches"][bid] = b
            _start(s, b, i, replace(it, attempt=it.attempt + 1, assigned_height=height,
                                    due=height + p.commit_window + p.reveal_window, workers=workers,
                                    quorum=quorum, commits=(), reveals=(), tried=tried))
            return
    # decided for good: what this item's share of the escrow did not pay returns now (its audit fee too, unless
    # an audit opens: then the fee waits for the audit's close)
    share = p.replication * p.price * (1 + p.max_reissues)
    paid = sum(x for _, _, f, x in history if f == Fate.AGREED)
    status = ItemStatus.ACCEPTED if winner is not None else ItemStatus.REFUNDED
    it = replace(it, status=status, result=winner or b"", agreed=tuple(agreed), decided_height=height)
    if winner is not None:
        it = audit.draw_audit(s.params, beacon, bid, i, it, p.sender, eligible, height)
        if it.audit == AuditStatus.OPEN:
            s.tables["batch_due"][due_key(it.audit_due, bid, i)] = 0
            b = replace(b, auditing=b.auditing + 1)
    fee_back = 0 if it.audit == AuditStatus.OPEN else audit_share(s.params, p)
    b = _pay(s, b, p.sender, share - paid + fee_back, refund=True)
    s.tables["batch_items"][item_key(bid, i)] = it
    b = replace(b, decided=b.decided + 1, accepted=b.accepted + (winner is not None))
    _set_batch(s, _maybe_settle(s, b, height))


def _maybe_settle(s: StateView, b: Batch, height: int) -> Batch:
    """Settle ``b`` once every item is decided and no audit is open."""
    if b.decided == b.post.n_items and not b.auditing and b.status not in TERMINAL:
        if b.escrow_left:  # nothing should be left (each item returned its own share); kept exact regardless
            b = _pay(s, b, b.post.sender, b.escrow_left, refund=True)
        b = replace(b, status=BatchStatus.SETTLED, final_height=height)
    return b


def _close_audit(s: StateView, bid: bytes, i: int, height: int) -> None:
    """An audit's voting is over: apply its verdict (:mod:`node.ledger.core.batchaudit`)."""
    b: Batch = s.tables["batches"][bid]
    it: Item = s.tables["batch_items"][item_key(bid, i)]
    outcome, found = audit.verdict(it)
    # the members that voted the outcome (the committee's quorum result, upheld or overturning) are paid from the
    # item's audit fee; an undecided audit pays nobody; what is not paid returns to the requester
    pay, fee = member_pay(s.params, b.post), audit_share(s.params, b.post)
    if found is not None and outcome != AuditStatus.UNDECIDED:
        for m, r in it.audit_votes:
            if r == found and pay:
                b = _pay(s, b, m, pay, refund=False)
                fee -= pay
    if fee:
        b = _pay(s, b, b.post.sender, fee, refund=True)
    if outcome != AuditStatus.OVERTURNED or found is None:
        it = replace(it, audit=outcome)
    else:
        history = list(it.history)
        for w in it.agreed:  # they agreed on a wrong result: slashed as a dissenter would be
            took = _move_bond(s, w, slash_of(s.params), slash=True)
            b = replace(b, slashed=b.slashed + took)
            _set_worker(s, w, replace(_worker(s, w), run=0))
            history.append((it.attempt, w, Fate.OVERRULED, took))
        revealed = dict(it.reveals)
        vindicated = []
        for a, w, f, took in it.history:
            if a == it.attempt and f == Fate.DISSENTED and revealed.get(w) == found:
                back = _return_bond(s, w, took)
                b = replace(b, slashed=b.slashed - back)
                history.append((it.attempt, w, Fate.VINDICATED, back))
                vindicated.append(w)
        members = [m for m, r in it.audit_votes if r == found]
        it = replace(it, audit=AuditStatus.OVERTURNED, result=found, agreed=tuple(vindicated + members),
                     history=tuple(history))
        b = replace(b, overturned=b.overturned + 1)
    s.tables["batch_items"][item_key(bid, i)] = it
    b = replace(b, auditing=b.auditing - 1)
    _set_batch(s, _maybe_settle(s, b, height))


def end_block_batches(s: StateView, height: int, beacon: bytes) -> None:
    """Per-block batch work after the transactions, ``beacon`` being this block's hash: decide up to
    :data:`MAX_DECIDE_PER_BLOCK` items due at or before ``height`` (re-issuing those without a quorum), then assign up
    to :data:`MAX_ASSIGN_PER_BLOCK` new items of batches posted before this block."""
    if not open_batches(s):
        return
    floors = offers(s, s.eligible())  # the opted-in bonded accounts, read once per block
    able: dict[bytes, list[bytes]] = {}

    def eligible_for(bid: bytes) -> list[bytes]:
        if bid not in able:
            able[bid] = takers(floors, s.tables["batches"][bid].post)
        return able[bid]
    due: list[bytes] = []
    for k in s.tables["batch_due"]:
        if int.from_bytes(k[:8], "big") > height or len(due) >= MAX_DECIDE_PER_BLOCK:
            break
        due.append(k)
    for k in due:
        s.tables["batch_due"].pop(k)
        bid, i = k[8:24], int.from_bytes(k[24:28], "big")
        it: Item = s.tables["batch_items"][item_key(bid, i)]
        if it.status == ItemStatus.ASSIGNED:
            _decide(s, bid, i, height, beacon, eligible_for(bid))
        elif it.audit == AuditStatus.OPEN:  # an accepted item's audit is due
            _close_audit(s, bid, i, height)
    budget = MAX_ASSIGN_PER_BLOCK
    for bid in list(open_batches(s)):
        b: Batch = s.tables["batches"][bid]
        p = b.post
        if b.height >= height or b.assigned >= p.n_items:
            continue
        before = b.assigned
        while budget and b.assigned < p.n_items:
            workers, quorum = _assign(s, b, b.assigned, 0, height, beacon, eligible_for(bid), ())
            if not workers:
                break  # too few bonded workers: this batch waits
            _start(s, b, b.assigned, Item(attempt=0, assigned_height=height,
                                          due=height + p.commit_window + p.reveal_window, workers=workers,
                                          quorum=quorum))
            b = replace(b, assigned=b.assigned + 1, status=BatchStatus.RUNNING)
            budget -= 1
        if b.assigned != before:
            _set_batch(s, b)
        if not budget:
            break


def _height_need(s: StateView) -> str | None:
    """``batch`` while a batch is open (its items are assigned, decided and re-issued by heights)."""
    return "batch" if open_batches(s) else None


# ------------------------------------------------------------------ the module (node.ledger.core.modules)


def _unbond_blocker(s: StateView, worker: bytes, _bond_after: int) -> str | None:
    if held(s, worker) == 0:
        return None
    return "batch items assigned to this worker are undecided; unbond after they are decided"


MODULE = Module("batches", txs=BATCH_TXS,
                maps={"batches": Batch, "batch_items": Item,  # batch id ‖ item (4 bytes) -> Item
                      "batch_due": Codec(ident, int),  # decision height (8 bytes) ‖ batch id ‖ item -> 0
                      "batch_workers": WorkerRecord},
                sets=("open_batches",),
                store_keys={"batches": b"b", "batch_items": b"i", "batch_due": b"d", "batch_workers": b"w",
                            "open_batches": b"y"},
                work_txs=(BatchCommit, BatchReveal, BatchAuditVote), params=BATCH_PART, on_need=_height_need,
                on_apply=apply_batch_tx, on_end_block=end_block_batches,
                on_unbond=_unbond_blocker)


__all__ = ["MAX_ASSIGN_PER_BLOCK", "MAX_DECIDE_PER_BLOCK", "MODULE", "assignments_of", "end_block_batches", "held",
           "reputation"]
