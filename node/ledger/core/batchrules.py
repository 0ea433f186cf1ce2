"""Batch jobs' shared rules (:mod:`.batch` holds the design): who is drawn and at what quorum (:func:`draw`),
who takes a post's price (:func:`offers`, :func:`takers`), the per-requester and per-worker limits
(:func:`max_open_items`, :func:`held_limit`), the penalties (:func:`slash_of`, :func:`absent_penalty_of`), and
the state moves that the transactions (:mod:`.batchapply`) and the end block (:mod:`.batch`) share: a worker's
record, a bond slashed or returned, escrow paid out, a batch stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from ...encoding import H
from .batchstate import TERMINAL, Batch, WorkerRecord, open_batches
from .batchtx import MAX_ITEMS, BatchPost
from .genesis import TREASURY, Params
from .view import StateView


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
    """The workers of one item's attempt and its quorum (the rule in :mod:`.batch`). Deterministic in its
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


MAX_MISSED_SHIFT = 16  # a limit halves with each consecutive absence, at most 16 times (then 1)


def held_limit(p: Params, rec: WorkerRecord) -> int:
    """How many undecided assignments a worker may hold before it is drawn for no more: genesis ``batch_max_held``
    halved per consecutive absence (``rec.missed``), at least 1; 0 means no limit. After BOINC's per-host limit of
    jobs in progress (``max_wus_in_progress``) and its quota cut for hosts whose results miss their deadline
    (Anderson, "BOINC: A Platform for Volunteer Computing", J. Grid Computing 2020, §6)."""
    if not p.batch_max_held:
        return 0
    return max(1, p.batch_max_held >> min(rec.missed, MAX_MISSED_SHIFT))


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
        if bid in open_batches(s):  # it closes now: its items leave the requester's open count
            r = _worker(s, b.post.sender)
            _set_worker(s, b.post.sender, replace(r, open_items=r.open_items - b.post.n_items))
        open_batches(s).pop(bid, None)
    else:
        open_batches(s)[bid] = None
