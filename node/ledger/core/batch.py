"""Batch jobs checked by majority vote: the state transition (pure; called from :mod:`node.ledger.core.state`).

BOINC's replication with a quorum (Anderson, "BOINC: A Platform for Volunteer Computing", J. Grid Computing 2020,
§3.4 "Validation" and §5.3 "Adaptive replication"), applied to the seeds' "distributed pre-processing validated by
simple majority voting" (issue 14). Records in :mod:`node.ledger.core.batchstate`, transactions in
:mod:`node.ledger.core.batchtx`.

**Money** (base units). A post moves :meth:`BatchPost.escrow` ``= N × k × price × (1 + max_reissues)`` from the
requester's balance to its escrow; each item holds ``k × price × (1 + max_reissues)`` of it. When an item is decided
for good (accepted, or refunded after its last attempt), every agreeing worker of the deciding attempt has been paid
``price`` from escrow and the rest of the item's share returns to the requester's balance at once. A dissenting
worker's bond pays ``min(bond, batch_slash)`` and an absent one's ``min(bond, batch_absent_penalty)``, both to the
treasury (as in :mod:`node.ledger.core.jobs`: a requester paid for a worker's fault would gain from posting items
built to fail). Balances + bonds + escrows are therefore constant.

**Opt-in and price floors** (issue 24 finding 2). Batch work is never forced: the candidates of every draw (items,
re-issues and audits) are the bonded accounts with a live :class:`~node.ledger.core.batchtx.BatchOffer` whose
floor per token, times :meth:`BatchPost.tokens`, is at most the post's ``price`` (:func:`takers`). A post is
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
(halved per consecutive absence, :func:`held_limit`) is not drawn for more; a re-issue falls back to every fresh
worker rather than refund an item for lack of their capacity.

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
from collections.abc import Callable, Iterable
from dataclasses import replace

from ...encoding import MAX_AMOUNT, H
from . import batchaudit as audit
from .batchparams import BATCH_PART
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
)
from .batchtx import (
    BATCH_TXS,
    GENERATE,
    MAX_FLOOR,
    MAX_GENERATE_TOKENS,
    MAX_ITEMS,
    MAX_REISSUES,
    MAX_REPLICATION,
    MAX_WINDOW,
    TASK_KINDS,
    WITHDRAWN,
    BatchAuditVote,
    BatchCancel,
    BatchCommit,
    BatchOffer,
    BatchPost,
    BatchReveal,
    audit_share,
    commitment,
    escrow_of,
    member_pay,
)
from .genesis import TREASURY, Params
from .kv import Codec
from .module import Module, ident
from .txbase import Tx, _check
from .view import StateView

MAX_ASSIGN_PER_BLOCK = 64  # new items drawn per block, over all batches
MAX_DECIDE_PER_BLOCK = 64  # items decided (and possibly re-issued) per block, over all batches


def slash_of(p: Params) -> int:
    """Base units a dissenting result costs its worker's bond: genesis ``batch_slash``, or ``slash_amount`` if 0."""
    return p.batch_slash or p.slash_amount


def absent_penalty_of(p: Params) -> int:
    """Base units an absent (never committed, or never revealed) worker's bond pays: genesis
    ``batch_absent_penalty`` (checked below :func:`slash_of` by :meth:`Params.check`), or if 0
    ``min(job_start_penalty, slash_of(p) // 2)`` (below the slash on every chain, whatever its ``slash_amount``)."""
    return p.batch_absent_penalty or min(p.job_start_penalty, slash_of(p) // 2)


def draw(beacon: bytes, batch_id: bytes, item: int, attempt: int, candidates: Iterable[bytes], k: int, quorum: int,
         min_replication: int = 0, trusted: Callable[[bytes], bool] = lambda _w: False
         ) -> tuple[tuple[bytes, ...], int]:
    """The workers of one item's attempt and its quorum (the rule in the module docstring). Deterministic in its
    arguments. Returns ``((), 0)`` when fewer than ``k`` candidates remain."""
    ranked = sorted(set(candidates), key=lambda w: H(b"tally/batch-assign/v1", beacon, batch_id,
                                                     item.to_bytes(4, "big"), attempt.to_bytes(4, "big"), w))
    if len(ranked) < k:
        return (), 0
    first = ranked[:k]
    kk = k
    if min_replication:
        kk = max(min(min_replication, k), k - sum(1 for w in first if trusted(w)))
    return tuple(first[:kk]), max(kk // 2 + 1, kk - (k - quorum))


def _worker(s: StateView, w: bytes) -> WorkerRecord:
    rec: WorkerRecord = s.tables["batch_workers"].get(w, WorkerRecord())
    return rec


def _set_worker(s: StateView, w: bytes, rec: WorkerRecord) -> None:
    if rec == WorkerRecord():
        s.tables["batch_workers"].pop(w, None)
    else:
        s.tables["batch_workers"][w] = rec


def offers(s: StateView, eligible: Iterable[bytes]) -> dict[bytes, int]:
    """The floor (base units per token) of every account of ``eligible`` (bonded accounts) with a live offer."""
    out = {}
    for w in eligible:
        f = _worker(s, w).offer
        if f >= 0:
            out[w] = f
    return out


def takers(floors: dict[bytes, int], post: BatchPost) -> list[bytes]:
    """The accounts of ``floors`` (:func:`offers`) whose floor takes ``post``'s price: ``floor × tokens <=
    price``, in ``floors``' order."""
    t = post.tokens()
    return [w for w, f in floors.items() if f * t <= post.price]


def max_open_items(p: Params) -> int:
    """Items one requester's open batches may hold together: genesis ``batch_max_open_items``, 0 meaning
    :data:`MAX_ITEMS`."""
    return p.batch_max_open_items or MAX_ITEMS


def held(s: StateView, worker: bytes) -> int:
    """Assignments of ``worker`` not yet decided (its bond cannot be unbonded while any is)."""
    return _worker(s, worker).held


MAX_MISSED_SHIFT = 16  # a limit halves with each consecutive absence, at most 16 times (then 1)


def held_limit(p: Params, rec: WorkerRecord) -> int:
    """How many undecided assignments a worker may hold before it is drawn for no more: genesis ``batch_max_held``
    halved per consecutive absence (``rec.missed``), at least 1; 0 means no limit. After BOINC's per-host limit of
    jobs in progress (``max_wus_in_progress``) and its quota cut for hosts whose results miss their deadline
    (Anderson, "BOINC: A Platform for Volunteer Computing", J. Grid Computing 2020, §6)."""
    if not p.batch_max_held:
        return 0
    return max(1, p.batch_max_held >> min(rec.missed, MAX_MISSED_SHIFT))


def reputation(s: StateView, worker: bytes) -> WorkerRecord:
    """``worker``'s batch record: quorum agreements ever, consecutive ones, undecided assignments."""
    return _worker(s, worker)


def assignments_of(s: StateView, worker: bytes) -> list[tuple[bytes, int, int]]:
    """``(batch id, item, attempt)`` of every undecided assignment of ``worker`` (what its worker loop queries).
    O(undecided items of open batches)."""
    out = []
    for bid in s.open_batches:
        b: Batch = s.tables["batches"][bid]
        for i in range(b.assigned):
            it: Item = s.tables["batch_items"][item_key(bid, i)]
            if it.status == ItemStatus.ASSIGNED and worker in it.workers:
                out.append((bid, i, it.attempt))
    return out


def _move_bond(s: StateView, w: bytes, amount: int, slash: bool) -> int:
    acc = s.account(w)
    took = min(acc.bond, amount)
    s.accounts[w] = replace(acc, bond=acc.bond - took, slashed=acc.slashed + (took if slash else 0))
    t = s.account(TREASURY)
    s.accounts[TREASURY] = replace(t, balance=t.balance + took)
    return took


def _return_bond(s: StateView, w: bytes, amount: int) -> int:
    """The reverse of a slash by :func:`_move_bond`: up to ``amount`` base units go back from the treasury to
    ``w``'s bond (and off its slashed total). Returns what was returned (less if the treasury holds less)."""
    t = s.account(TREASURY)
    back = min(amount, t.balance)
    s.accounts[TREASURY] = replace(t, balance=t.balance - back)
    acc = s.account(w)
    s.accounts[w] = replace(acc, bond=acc.bond + back, slashed=acc.slashed - back)
    return back


def _pay(s: StateView, batch: Batch, to: bytes, amount: int, refund: bool) -> Batch:
    """Move ``amount`` from the requester's escrow to ``to``'s balance (to the requester itself for a refund)."""
    req = batch.post.sender
    acc = s.account(req)
    s.accounts[req] = replace(acc, escrow=acc.escrow - amount)
    dest = s.account(to)
    s.accounts[to] = replace(dest, balance=dest.balance + amount)
    if refund:
        return replace(batch, escrow_left=batch.escrow_left - amount, refunded=batch.refunded + amount)
    return replace(batch, escrow_left=batch.escrow_left - amount, paid=batch.paid + amount)


def _set_batch(s: StateView, b: Batch) -> None:
    bid = b.post.batch_id
    s.tables["batches"][bid] = b
    if b.status in TERMINAL:
        if bid in s.open_batches:  # it closes now: its items leave the requester's open count
            r = _worker(s, b.post.sender)
            _set_worker(s, b.post.sender, replace(r, open_items=r.open_items - b.post.n_items))
        s.open_batches.pop(bid, None)
    else:
        s.open_batches[bid] = None


def _check_post(s: StateView, tx: BatchPost) -> None:
    _check(tx.batch_id not in s.tables["batches"], "a batch with this id exists")
    _check(1 <= tx.n_items <= MAX_ITEMS, f"n_items must be in 1..{MAX_ITEMS} (got {tx.n_items})")
    _check(tx.kind in TASK_KINDS, f"kind must be one of {', '.join(TASK_KINDS)} (got {tx.kind!r})")
    if tx.kind == GENERATE:
        _check(1 <= tx.max_tokens <= MAX_GENERATE_TOKENS,
               f"max_tokens must be in 1..{MAX_GENERATE_TOKENS} for generate (got {tx.max_tokens})")
    else:
        _check(tx.max_tokens == 0, f"max_tokens must be 0 for score (got {tx.max_tokens})")
    k, q = tx.replication, tx.quorum
    _check(2 <= k <= MAX_REPLICATION, f"replication k must be in 2..{MAX_REPLICATION} (got {k})")
    _check(k < 2 * q and q <= k, f"quorum q must satisfy k/2 < q <= k (got k {k}, q {q})")
    _check(tx.price >= 1, "price per item per replica must be at least 1 base unit")
    _check(0 <= tx.max_reissues <= MAX_REISSUES, f"max_reissues must be in 0..{MAX_REISSUES}")
    _check(1 <= tx.commit_window <= MAX_WINDOW and 1 <= tx.reveal_window <= MAX_WINDOW,
           f"commit_window and reveal_window must be in 1..{MAX_WINDOW} blocks")
    p = s.params
    esc = escrow_of(p, tx)
    _check(esc <= MAX_AMOUNT, "the batch's escrow (n_items × (k × price × (1 + max_reissues) + audit fee)) is "
                              "too large")
    floor, tokens = p.batch_token_floor(), tx.tokens()
    _check(tx.price >= floor * tokens,
           f"price {tx.price} per item per replica is below the chain's floor of {floor} base units per token × "
           f"{tokens} tokens per item = {floor * tokens} (genesis batch_min_token_price)")
    _check(s.account(tx.sender).balance >= esc,
           f"balance cannot cover the batch's escrow of {esc} base units "
           "(n_items × (k × price × (1 + max_reissues) + audit fee))")
    cap, have = max_open_items(p), _worker(s, tx.sender).open_items
    _check(have + tx.n_items <= cap,
           f"this requester's open batches hold {have} items; {tx.n_items} more would exceed the chain's cap of "
           f"{cap} (genesis batch_max_open_items): wait for them to settle, or cancel one")
    able = 0
    for w, rec in s.tables["batch_workers"].items():  # stops at the k-th opted-in account that takes the price
        if (rec.offer >= 0 and rec.offer * tokens <= tx.price and w != tx.sender
                and s.account(w).bond >= p.min_bond):
            able += 1
            if able >= tx.replication:
                break
    _check(able >= tx.replication,
           f"only {able} bonded account(s) other than the requester accept batches at {tx.price} base units per "
           f"item ({tx.price // tokens} per token); replication k = {tx.replication} needs {tx.replication}: "
           "raise the price or lower k (workers opt in with 'node start --accept-batches --batch-floor')")


def _open_item(s: StateView, tx: BatchCommit | BatchReveal) -> tuple[Batch, Item]:
    b: Batch | None = s.tables["batches"].get(tx.batch_id)
    _check(b is not None, "unknown batch")
    assert b is not None
    _check(0 <= tx.item < b.assigned, f"item {tx.item} of this batch is not assigned")
    it: Item = s.tables["batch_items"][item_key(tx.batch_id, tx.item)]
    _check(it.status == ItemStatus.ASSIGNED, f"item {tx.item} is already decided ({it.status.value})")
    _check(tx.attempt == it.attempt, f"item {tx.item} is in attempt {it.attempt}, not {tx.attempt}")
    _check(tx.sender in it.workers, "this worker is not assigned to this item")
    return b, it


def apply_batch_tx(s: StateView, tx: Tx) -> None:
    """Apply a batch transaction to ``s`` in place (every check first: a refused tx changes nothing). The caller,
    :func:`node.ledger.core.state.apply_tx`, checks signatures and the nonce of posts and cancels.

    Raises:
        InvalidTx: a bad post (amounts, k or q out of range, unknown kind, balance short, a price below the
            genesis floor, over the requester's cap of open items, fewer than k opted-in accounts that take its
            price), an offer with a floor out of range or from an account that is not bonded, a withdrawal
            without a live offer, a cancel of a batch that is not the sender's or has assigned items, a commit or
            reveal from a worker not assigned to the item, outside its window, twice, or (reveal) not matching
            its commitment.
    """
    height = s.height + 1
    if isinstance(tx, BatchAuditVote):
        audit.apply_audit_vote(s, tx)
    elif isinstance(tx, BatchOffer):
        f = tx.min_price_per_token
        _check(f == WITHDRAWN or 0 <= f <= MAX_FLOOR,
               f"min_price_per_token must be -1 (withdraw) or in 0..{MAX_FLOOR} base units per token")
        # neither creates state for free: an offer needs a bond (an unbonded account is never drawn), a withdrawal
        # a live offer
        if f == WITHDRAWN:
            _check(_worker(s, tx.sender).offer >= 0, "this account has no batch offer to withdraw")
        else:
            _check(s.account(tx.sender).bond >= s.params.min_bond,
                   f"only a bonded account (bond at least min_bond = {s.params.min_bond} base units) may offer "
                   "to take batch items")
        _set_worker(s, tx.sender, replace(_worker(s, tx.sender), offer=f))
    elif isinstance(tx, BatchPost):
        _check_post(s, tx)
        acc = s.account(tx.sender)
        esc = escrow_of(s.params, tx)
        s.accounts[tx.sender] = replace(acc, balance=acc.balance - esc, escrow=acc.escrow + esc)
        r = _worker(s, tx.sender)
        _set_worker(s, tx.sender, replace(r, open_items=r.open_items + tx.n_items))
        _set_batch(s, Batch(post=tx, height=height, escrow_left=esc))
    elif isinstance(tx, BatchCancel):
        b: Batch | None = s.tables["batches"].get(tx.batch_id)
        _check(b is not None and b.post.sender == tx.sender, "no such batch of yours")
        assert b is not None
        _check(b.status == BatchStatus.OPEN, f"only a batch with no item assigned can be cancelled; this one is "
                                             f"{b.status.value}")
        b = _pay(s, b, b.post.sender, b.escrow_left, refund=True)
        _set_batch(s, replace(b, status=BatchStatus.CANCELLED, final_height=height))
    elif isinstance(tx, BatchCommit):
        b, it = _open_item(s, tx)
        _check(it.commitment_of(tx.sender) is None, "this worker already committed to this item")
        end = it.assigned_height + b.post.commit_window
        _check(height <= end, f"the commit window of this item closed at height {end}")
        s.tables["batch_items"][item_key(tx.batch_id, tx.item)] = replace(
            it, commits=it.commits + ((tx.sender, tx.commitment),))
    elif isinstance(tx, BatchReveal):
        b, it = _open_item(s, tx)
        c = it.commitment_of(tx.sender)
        _check(c is not None, "this worker did not commit to this item")
        _check(all(w != tx.sender for w, _ in it.reveals), "this worker already revealed this item")
        cw_end = it.assigned_height + b.post.commit_window
        _check(height > cw_end or len(it.commits) == len(it.workers),
               f"reveals open after the commit window (height {cw_end}) or once every drawn worker committed")
        _check(height <= it.due, f"the reveal window of this item closed at height {it.due}")
        _check(commitment(tx.batch_id, tx.item, tx.attempt, tx.sender, tx.result_hash, tx.salt) == c,
               "the reveal does not match its commitment")
        it = replace(it, reveals=it.reveals + ((tx.sender, tx.result_hash),))
        key = item_key(tx.batch_id, tx.item)
        if len(it.reveals) == len(it.workers) and it.due != height:  # everyone revealed: decide in this block
            s.tables["batch_due"].pop(due_key(it.due, tx.batch_id, tx.item), None)
            s.tables["batch_due"][due_key(height, tx.batch_id, tx.item)] = 0
            it = replace(it, due=height)
        s.tables["batch_items"][key] = it


def _assign(s: StateView, b: Batch, i: int, attempt: int, height: int, beacon: bytes, eligible: list[bytes],
            exclude: tuple[bytes, ...], limit: bool = True) -> tuple[tuple[bytes, ...], int]:
    """Draw an item's workers among ``eligible`` (the batch's :func:`takers`) but the requester and ``exclude``;
    with ``limit`` (and genesis ``batch_max_held``), only among those below their :func:`held_limit`."""
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
    if not s.open_batches:
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
    for bid in list(s.open_batches):
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
    return "batch" if s.open_batches else None


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


__all__ = ["MAX_ASSIGN_PER_BLOCK", "MAX_DECIDE_PER_BLOCK", "BatchCancel", "BatchCommit", "BatchOffer", "BatchPost",
           "BatchReveal", "absent_penalty_of", "apply_batch_tx", "assignments_of", "audit_share", "draw",
           "end_block_batches", "escrow_of", "held", "held_limit", "max_open_items", "member_pay", "offers",
           "reputation", "slash_of", "takers"]
