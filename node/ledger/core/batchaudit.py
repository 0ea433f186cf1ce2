"""Committee audits of decided batch items: what catches a colluding majority in the long run (issue 14, check 3).

A quorum of replicas catches a lone cheater, not a group: two colluders drawn for the same item of k = 3 form its
majority, their shared wrong result is accepted and the honest third is slashed for dissenting. Sampled committee
re-execution, which Tally applies to single-replica work (:mod:`node.ledger.core.state`), closes that gap here too.

**Draw.** With genesis ``batch_audit_ppm`` > 0, every item accepted in ``end_block`` of height h is audited with
probability ``batch_audit_ppm`` / 10^6 (an item decided by a single replica, which adaptive replication allows,
with at least the receipts' floor ``sample_floor_ppm``: "sampled committee re-execution remains for single-replica
work"), drawn by :func:`node.ledger.core.sampling.is_sampled` on that block's hash
(unknown to every worker when it revealed) and the item's :func:`audit_id`. Its committee is
:func:`node.ledger.core.committee.select_committee` on the same beacon, ``committee_size`` members among the eligible
accounts other than the requester and every worker of any of the item's attempts (they have a stake in the
outcome). No eligible member: no audit.

**Votes.** Each member re-runs the item and sends a :class:`~node.ledger.core.batchtx.BatchAuditVote` with its
result hash, until ``verdict_timeout`` blocks after the draw (then the audit closes with the votes it has; it closes
at once when every member voted). There is no commit–reveal: a member that copies the votes already on the chain
saves its work but cannot change a verdict that the members before it decided (as with receipt committees).

**Verdict** (:func:`verdict`). The committee's result is the hash voted by more than 2/3 of its size (the receipt
committees' quorum, :func:`node.ledger.core.committee.tally`); none: **undecided**, nothing moves. Equal to the
accepted result: **upheld**, nothing moves. Another hash: the audit counts every replica of the item, the deciding
attempt's reveals and the committee's votes together, and **overturns** only if the committee's result has more of
them than the accepted one; otherwise it is **undecided**. The item's outcome is thus the majority of all k + c
independent replicas: a colluding pair that forms a k = 3 majority is outnumbered by the honest dissenter and an
honest committee of two (3 to 2), while the same pair drawn as the whole committee of an honestly decided item is
outnumbered by its three replicas (2 to 3) and cannot overturn it (seen in the first process run of check 3, with
five workers and a committee of two: the quorum of the committee alone overturned an honest item). An overturned
item (:func:`node.ledger.core.batch` applies it): every worker that agreed on the accepted result pays
``min(bond, batch_slash)`` to the treasury (fate ``overruled``; it keeps the price it was paid, which the slash
exceeds), every dissenter of that attempt that revealed the committee's result gets its slash back from the
treasury (fate ``vindicated``), and the committee's result becomes the item's (``agreed``: the vindicated and the
members that voted it, who hold its bytes).

**Pay** (issue 24 finding 8). With genesis ``batch_audit_pay_bps``, a post escrows ``committee_size × price ×
batch_audit_pay_bps / 10^4`` per item (:func:`node.ledger.core.batch.audit_share`); when an audit closes upheld or
overturned, each member that voted the committee's result is paid ``price × batch_audit_pay_bps / 10^4`` from it,
and the rest (members that voted otherwise or not at all, an undecided audit, an item never audited) returns to the
requester. Committees are drawn only among accounts that opted in to batch work at the batch's price
(:func:`node.ledger.core.batchrules.takers`). Not closed here: votes are not committed first, so a member that copies
the votes already on the chain is paid without re-running the item (it still cannot change a verdict the members
before it decided); a commit–reveal of audit votes, as items have, would close that.

While an item's audit is open its batch stays ``running`` (the requester's results may still change).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from ...encoding import H
from . import committee as cm
from .batchstate import AuditStatus, Batch, Item, ItemStatus, due_key, item_key, open_batches
from .batchtx import BatchAuditVote
from .genesis import Params
from .sampling import is_sampled
from .txbase import _check
from .view import StateView


def audit_id(batch_id: bytes, item: int) -> bytes:
    """The 32-byte id an item's audit is sampled and its committee drawn by."""
    return H(b"tally/batch-audit/v1", item_key(batch_id, item))


def draw_audit(p: Params, beacon: bytes, batch_id: bytes, i: int, it: Item, requester: bytes,
               eligible: Iterable[bytes], height: int) -> Item:
    """``it`` (just accepted at ``height``) with an open audit if the beacon samples it and a committee can be drawn;
    else ``it`` unchanged."""
    ppm = p.batch_audit_ppm
    if len(it.workers) == 1:  # single-replica work (adaptive replication): sampled like any receipt, at least
        ppm = max(ppm, p.sample_floor_ppm)
    if not ppm or not is_sampled(beacon, audit_id(batch_id, i), ppm):
        return it
    com = cm.select_committee(beacon, audit_id(batch_id, i), 0, eligible, (requester, *it.tried, *it.workers),
                              p.committee_size)
    if not com:
        return it
    return replace(it, audit=AuditStatus.OPEN, audit_committee=com, audit_due=height + p.verdict_timeout)


def apply_audit_vote(s: StateView, tx: BatchAuditVote) -> None:
    """Record a committee member's result hash (checks first; a refused vote changes nothing).

    Raises:
        InvalidTx: unknown batch or item, no open audit, the sender is not on its committee, voted already, or the
            audit's voting closed.
    """
    b: Batch | None = s.tables["batches"].get(tx.batch_id)
    _check(b is not None and 0 <= tx.item < b.assigned, "unknown batch item")
    key = item_key(tx.batch_id, tx.item)
    it: Item = s.tables["batch_items"][key]
    _check(it.status == ItemStatus.ACCEPTED and it.audit == AuditStatus.OPEN, "this item has no open audit")
    _check(tx.sender in it.audit_committee, "this account is not on the item's audit committee")
    _check(all(m != tx.sender for m, _ in it.audit_votes), "this member already voted on this audit")
    height = s.height + 1
    _check(height <= it.audit_due, f"the audit's voting closed at height {it.audit_due}")
    it = replace(it, audit_votes=it.audit_votes + ((tx.sender, tx.result_hash),))
    if len(it.audit_votes) == len(it.audit_committee) and it.audit_due != height:  # all voted: close in this block
        s.tables["batch_due"].pop(due_key(it.audit_due, tx.batch_id, tx.item), None)
        s.tables["batch_due"][due_key(height, tx.batch_id, tx.item)] = 0
        it = replace(it, audit_due=height)
    s.tables["batch_items"][key] = it


def verdict(it: Item) -> tuple[AuditStatus, bytes | None]:
    """The audit's outcome (module docstring) and the committee's result hash (None when it has no quorum)."""
    votes = Counter(r for _, r in it.audit_votes)
    found = next((r for r, n in votes.items() if 3 * n > 2 * len(it.audit_committee)), None)
    if found is None:
        return AuditStatus.UNDECIDED, None
    if found == it.result:
        return AuditStatus.UPHELD, found
    support = Counter(r for _, r in it.reveals) + votes
    return (AuditStatus.OVERTURNED if support[found] > support[it.result] else AuditStatus.UNDECIDED), found


def audits_of(s: StateView, member: bytes) -> list[tuple[bytes, int]]:
    """``(batch id, item)`` of every open audit on whose committee ``member`` sits and has not voted (what its
    worker loop queries). O(items of open batches)."""
    out = []
    for bid in open_batches(s):
        b: Batch = s.tables["batches"][bid]
        if not b.auditing:
            continue
        for i in range(b.assigned):
            it: Item = s.tables["batch_items"][item_key(bid, i)]
            if (it.audit == AuditStatus.OPEN and member in it.audit_committee
                    and all(m != member for m, _ in it.audit_votes)):
                out.append((bid, i))
    return out


__all__ = ["apply_audit_vote", "audit_id", "audits_of", "draw_audit", "verdict"]
