"""Batch jobs' transactions applied to the state (:mod:`.batch` holds the design): a post checked and escrowed,
an offer made or withdrawn, a cancel refunded, a worker's commit and reveal checked against its item; an audit
vote goes to :mod:`.batchaudit`. Pure, like the rest of the core.
"""

from __future__ import annotations

from dataclasses import replace

from ...encoding import MAX_AMOUNT
from . import batchaudit as audit
from .batchrules import _pay, _set_batch, _set_worker, _worker, max_open_items
from .batchstate import Batch, BatchStatus, Item, ItemStatus, due_key, item_key
from .batchtx import (
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
    commitment,
    escrow_of,
)
from .txbase import Tx, _check
from .view import StateView


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
