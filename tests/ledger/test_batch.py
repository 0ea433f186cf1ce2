"""Batch jobs checked by majority vote (issue 14, ledger half): post, beacon assignment, commit–reveal, majority vote,
settlement, re-issue and refund, penalties, reputation, adaptive replication; credits conserved after every block.
Real signatures and real state transitions on the in-memory state; one test through a real LevelDB store."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from node.identity import Identity, dev_seed
from node.ledger.core import batch as bm, batchrules as br
from node.ledger.core.batchstate import BatchStatus, Fate, Item, ItemStatus, WorkerRecord, item_key, open_batches
from node.ledger.core.batchtx import (
    BatchCancel,
    BatchCommit,
    BatchOffer,
    BatchPost,
    BatchReveal,
    commitment,
    items_root,
)
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.genesis import TREASURY, Genesis, Params
from node.ledger.core.records import CODECS
from node.ledger.core.state import apply_tx, genesis_state as bare_genesis_state
from node.ledger.core.tx import InvalidTx, Unbond, decode_tx
from node.ledger.store import LedgerStore

C = 10**9
KEYS = [Identity.from_seed(dev_seed(i)) for i in range(8)]
REQ = KEYS[0]
WORKERS = KEYS[1:7]  # six bonded workers
BY_ACCOUNT = {k.account: k for k in KEYS}
PRICE = 1_000_000


def genesis(**params) -> Genesis:
    p = Params(**{"block_time_ms": 100, "price_per_token_block": 1000, "max_receipt_price": C,
                  "slash_amount": 100 * C, **params})
    p.check()
    bal = [(REQ.account, 1000 * C, 0)] + [(k.account, 100 * C, 200 * C) for k in WORKERS]
    return Genesis("batch-chain", 0, (REQ.account,), tuple(bal), p)


G = genesis()


def genesis_state(g):
    """The genesis state with a live offer (floor 0) of every bonded worker, as ``BatchOffer`` transactions in an
    earlier block would leave it (offers themselves are tested in ``test_batch_offers.py``)."""
    s = bare_genesis_state(g)
    for a, _bal, bond in g.balances:
        if bond >= g.params.min_bond:
            s.tables["batch_workers"][a] = WorkerRecord(offer=0)
    return s


def post(s, g=G, n=2, k=3, q=2, price=PRICE, reissues=1, cw=3, rw=3, kind="generate", tokens=16, nonce=None,
         batch_id=None, sender=REQ):
    lines = [f'{{"prompt": "line {i}"}}'.encode() for i in range(n)]
    tx = BatchPost(g.domain, sender.account, batch_id or os.urandom(16), items_root(lines), n, kind, tokens, k,
                   q, price, reissues, cw, rw, s.account(sender.account).nonce if nonce is None else nonce)
    return tx.signed(sender)


def blocks(s, *batches, g=G):
    """Apply each list of transactions as one block (all must apply); conservation checked after every block."""
    for txs in batches:
        _, s, rejected = propose(s, list(txs), REQ, 0, ())
        assert not rejected, rejected
        check_conserved(s, g)
    return s


def check_conserved(s, g=G):
    assert s.supply() == g.supply
    assert all(a.balance >= 0 and a.bond >= 0 and a.escrow >= 0 for a in s.accounts.values())
    # the requester's escrow is exactly what its open batches still hold
    open_left = sum(s.tables["batches"][b].escrow_left for b in open_batches(s))
    assert s.account(REQ.account).escrow == open_left


def item(s, bid, i) -> Item:
    return s.tables["batch_items"][item_key(bid, i)]


def commit(s, bid, i, worker, result, salt=b"s" * 32, g=G):
    it = item(s, bid, i)
    c = commitment(bid, i, it.attempt, worker.account, result, salt)
    return BatchCommit(g.domain, worker.account, bid, i, it.attempt, c).signed(worker)


def reveal(s, bid, i, worker, result, salt=b"s" * 32, g=G):
    it = item(s, bid, i)
    return BatchReveal(g.domain, worker.account, bid, i, it.attempt, result, salt).signed(worker)


def refused(s, tx, match):
    """``tx`` is refused with ``match`` and the state is unchanged (same root)."""
    root = s.state_root()
    w = s.copy()
    with pytest.raises(InvalidTx, match=match):
        apply_tx(w, tx)
    assert w.state_root() == root


def posted(g=G, **kw):
    """A batch posted (block 1) and assigned (block 2)."""
    s0 = genesis_state(g)
    p = post(s0, g, **kw)
    s = blocks(s0, [p], [], g=g)
    return s, p


A, B, X = b"A" * 32, b"B" * 32, b"X" * 32


def test_post_assign_commit_reveal_settle_slashes_the_dissenter():
    s0 = genesis_state(G)
    p = post(s0)
    s = blocks(s0, [p])
    req = s.account(REQ.account)
    assert p.escrow() == 2 * 3 * PRICE * 2 and req.escrow == p.escrow()
    assert req.balance == 1000 * C - p.escrow()
    assert s.tables["batches"][p.batch_id].status == BatchStatus.OPEN and s.tables["batches"][p.batch_id].assigned == 0
    s = blocks(s, [])  # the next block's hash is the beacon: both items drawn
    b = s.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.RUNNING and b.assigned == 2
    for i in range(2):
        ws = item(s, p.batch_id, i).workers
        assert len(set(ws)) == 3 and REQ.account not in ws and all(bm.held(s, w) >= 1 for w in ws)
    w0 = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    w1 = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 1).workers]
    before = {k.account: s.account(k.account) for k in WORKERS}
    treasury0 = s.account(TREASURY).balance
    s = blocks(s, [commit(s, p.batch_id, 0, w0[0], A), commit(s, p.batch_id, 0, w0[1], A),
                   commit(s, p.batch_id, 0, w0[2], B)] + [commit(s, p.batch_id, 1, w, X) for w in w1])
    assert len(item(s, p.batch_id, 0).commits) == 3
    s = blocks(s, [reveal(s, p.batch_id, 0, w0[0], A), reveal(s, p.batch_id, 0, w0[1], A),
                   reveal(s, p.batch_id, 0, w0[2], B)] + [reveal(s, p.batch_id, 1, w, X) for w in w1])
    it0, it1 = item(s, p.batch_id, 0), item(s, p.batch_id, 1)
    assert it0.status == ItemStatus.ACCEPTED and it0.result == A and set(it0.agreed) == {w0[0].account, w0[1].account}
    assert it1.status == ItemStatus.ACCEPTED and it1.result == X and len(it1.agreed) == 3
    fates = {w: f for _, w, f, _ in it0.history}
    assert fates[w0[2].account] == Fate.DISSENTED
    slash = G.params.slash_amount
    assert s.account(w0[2].account).bond == before[w0[2].account].bond - slash
    assert s.account(w0[2].account).slashed == slash
    assert s.account(TREASURY).balance == treasury0 + slash
    for w in (w0[0], w0[1]):
        assert s.account(w.account).balance - before[w.account].balance == PRICE * (1 + (w in w1))
    b = s.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.SETTLED and b.decided == 2 and b.accepted == 2 and b.paid == 5 * PRICE
    assert b.refunded == p.escrow() - 5 * PRICE and b.escrow_left == 0 and b.slashed == slash
    assert s.account(REQ.account).escrow == 0 and s.account(REQ.account).balance == 1000 * C - 5 * PRICE
    assert p.batch_id not in open_batches(s)
    # item 0 is decided before item 1 (same height, key order): the dissent resets the run, item 1 may add one
    for w in w0:
        agreed = (w is not w0[2]) + (w in w1)
        assert bm.reputation(s, w.account) == WorkerRecord(agreed=agreed, run=(w in w1) if w is w0[2] else agreed,
                                                            offer=0)
    assert all(bm.held(s, k.account) == 0 for k in WORKERS)


def test_commitless_and_revealless_workers_are_not_paid_and_pay_the_absent_penalty():
    s, p = posted(n=1, reissues=0, cw=2, rw=2)
    ws = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    start = {k.account: s.account(k.account) for k in ws}
    s = blocks(s, [commit(s, p.batch_id, 0, ws[0], A), commit(s, p.batch_id, 0, ws[1], A)])  # ws[2] never commits
    refused(s, reveal(s, p.batch_id, 0, ws[0], A), "reveals open after the commit window")
    s = blocks(s, [])  # the commit window (2 blocks after the assignment) closes
    s = blocks(s, [reveal(s, p.batch_id, 0, ws[0], A)])  # ws[1] committed but never reveals
    assert item(s, p.batch_id, 0).status == ItemStatus.ASSIGNED
    s = blocks(s, [])  # end of the reveal window: decided
    it = item(s, p.batch_id, 0)
    fates = {w: (f, x) for _, w, f, x in it.history}
    pen = G.params.job_start_penalty
    # one reveal of a quorum of 2: no quorum, so nobody is paid; the absent two pay the penalty
    assert it.status == ItemStatus.REFUNDED and fates[ws[0].account] == (Fate.NO_QUORUM, 0)
    assert fates[ws[1].account] == (Fate.UNREVEALED, pen) and fates[ws[2].account] == (Fate.ABSENT, pen)
    for w in ws:
        assert s.account(w.account).balance == start[w.account].balance
    assert s.account(ws[1].account).bond == start[ws[1].account].bond - pen
    assert s.account(ws[2].account).bond == start[ws[2].account].bond - pen
    assert s.account(ws[0].account).bond == start[ws[0].account].bond
    assert s.account(REQ.account).balance == 1000 * C and s.tables["batches"][p.batch_id].status == BatchStatus.SETTLED


def test_quorum_with_one_absent_worker_pays_the_two_and_penalises_the_third():
    s, p = posted(n=1, reissues=0, cw=2, rw=2)
    ws = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    s = blocks(s, [commit(s, p.batch_id, 0, ws[0], A), commit(s, p.batch_id, 0, ws[1], A)], [])
    s = blocks(s, [reveal(s, p.batch_id, 0, w, A) for w in ws[:2]], [])
    it = item(s, p.batch_id, 0)
    assert it.status == ItemStatus.ACCEPTED and it.result == A
    assert {w: f for _, w, f, _ in it.history}[ws[2].account] == Fate.ABSENT
    assert s.account(ws[2].account).slashed == 0  # a penalty, not a slash
    assert s.tables["batches"][p.batch_id].paid == 2 * PRICE


def test_no_quorum_is_reissued_to_fresh_workers_then_refunded():
    s, p = posted(n=1, reissues=1, cw=1, rw=1)
    first = item(s, p.batch_id, 0).workers
    ws = [BY_ACCOUNT[w] for w in first]
    s = blocks(s, [commit(s, p.batch_id, 0, w, r) for w, r in zip(ws, (A, B, X), strict=True)])
    s = blocks(s, [reveal(s, p.batch_id, 0, w, r) for w, r in zip(ws, (A, B, X), strict=True)])
    it = item(s, p.batch_id, 0)
    assert it.attempt == 1 and it.status == ItemStatus.ASSIGNED and set(it.tried) == set(first)
    assert not set(it.workers) & set(first) and len(it.workers) == 3  # fresh workers only
    assert all(bm.held(s, w) == 0 for w in first) and all(bm.held(s, w) == 1 for w in it.workers)
    # the old attempt's workers can no longer commit; an old-attempt commit is refused too
    refused(s, commit(s, p.batch_id, 0, ws[0], A), "not assigned")
    s = blocks(s, [], [], [])  # nobody of the second attempt commits: no reissue left, refunded
    it = item(s, p.batch_id, 0)
    assert it.status == ItemStatus.REFUNDED
    assert sum(1 for a, _, f, _ in it.history if a == 1 and f == Fate.ABSENT) == 3
    b = s.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.SETTLED and b.paid == 0 and b.refunded == p.escrow()
    assert s.account(REQ.account).balance == 1000 * C and s.account(REQ.account).escrow == 0


def test_reissue_without_enough_fresh_workers_refunds_at_once():
    s, p = posted(n=1, reissues=3, cw=1, rw=1, k=4, q=3)
    ws = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    s = blocks(s, [], [], [])  # nobody commits; only 2 workers are fresh (6 - 4 < 4)
    it = item(s, p.batch_id, 0)
    assert it.status == ItemStatus.REFUNDED and it.attempt == 0 and len(ws) == 4


def test_reveal_must_match_its_commitment():
    s, p = posted(n=1)
    ws = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    s = blocks(s, [commit(s, p.batch_id, 0, w, A) for w in ws])
    refused(s, reveal(s, p.batch_id, 0, ws[0], B), "does not match its commitment")
    refused(s, reveal(s, p.batch_id, 0, ws[0], A, salt=b"t" * 32), "does not match its commitment")
    # a commitment is bound to its worker: another worker's valid opening does not open it
    other = BatchReveal(G.domain, ws[1].account, p.batch_id, 0, 0, A, b"s" * 32).signed(ws[1])
    apply_tx(s.copy(), other)  # ws[1]'s own opening applies
    s = blocks(s, [reveal(s, p.batch_id, 0, ws[0], A)])
    refused(s, reveal(s, p.batch_id, 0, ws[0], A), "already revealed")


def test_copied_commitment_cannot_be_opened_by_the_copier():
    s, p = posted(n=1)
    ws = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    honest = commit(s, p.batch_id, 0, ws[0], A)
    copied = BatchCommit(G.domain, ws[1].account, p.batch_id, 0, 0, honest.commitment).signed(ws[1])
    s = blocks(s, [honest, copied, commit(s, p.batch_id, 0, ws[2], A)])
    refused(s, reveal(s, p.batch_id, 0, ws[1], A), "does not match its commitment")


def test_commit_after_its_window_and_twice_refused():
    s, p = posted(n=1, cw=2, rw=2, reissues=0)
    ws = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    s = blocks(s, [commit(s, p.batch_id, 0, ws[0], A)])
    refused(s, commit(s, p.batch_id, 0, ws[0], B), "already committed")
    s = blocks(s, [])
    refused(s, commit(s, p.batch_id, 0, ws[1], A), "commit window of this item closed")
    s = blocks(s, [], [])
    refused(s, reveal(s, p.batch_id, 0, ws[0], A), "already decided")


def test_unassigned_worker_and_requester_refused():
    s, p = posted(n=1)
    assigned = set(item(s, p.batch_id, 0).workers)
    outsider = next(k for k in WORKERS if k.account not in assigned)
    refused(s, commit(s, p.batch_id, 0, outsider, A), "not assigned to this item")
    refused(s, commit(s, p.batch_id, 0, REQ, A), "not assigned to this item")
    refused(s, BatchCommit(G.domain, outsider.account, p.batch_id, 5, 0, A).signed(outsider),
            "item 5 .* not assigned")
    refused(s, BatchCommit(G.domain, outsider.account, os.urandom(16), 0, 0, A).signed(outsider), "unknown batch")
    ws = [BY_ACCOUNT[w] for w in assigned]
    refused(s, BatchCommit(G.domain, ws[0].account, p.batch_id, 0, 1, A).signed(ws[0]), "attempt 0, not 1")
    forged = replace(commit(s, p.batch_id, 0, ws[0], A), sig=b"\x00" * 64)
    refused(s, forged, "bad batch_commit signature")


@pytest.mark.parametrize("kw, match", [
    ({"k": 1, "q": 1}, "replication k"), ({"k": 17, "q": 9}, "replication k"), ({"k": 3, "q": 1}, "quorum q"),
    ({"k": 4, "q": 2}, "quorum q"), ({"k": 3, "q": 4}, "quorum q"), ({"price": 0}, "price"),
    ({"kind": "train"}, "kind must be"), ({"tokens": 0}, "max_tokens"), ({"kind": "score", "tokens": 5}, "max_tokens"),
    ({"n": 0}, "n_items"), ({"cw": 0}, "window"), ({"rw": 10_001}, "window"), ({"reissues": 9}, "max_reissues"),
    ({"n": 1000, "price": C}, "cannot cover"), ({"nonce": 5}, "bad nonce"),
])
def test_bad_posts_refused_with_the_state_unchanged(kw, match):
    s = genesis_state(G)
    refused(s, post(s, **kw), match)


def test_bad_accounts_refused_at_decode():
    s = genesis_state(G)
    p = post(s)
    wire = p.to_wire()
    wire["f"][0] = b"\xff" * 32  # not an Ed25519 point: no key could spend from it
    with pytest.raises(InvalidTx, match="not a valid Ed25519 public key"):
        decode_tx(wire)
    assert decode_tx(p.to_wire()) == p
    s2 = blocks(s, [p])
    refused(s2, post(s2, batch_id=p.batch_id), "batch with this id exists")
    poor = KEYS[7]  # an account with nothing
    refused(s2, post(s2, sender=poor), "cannot cover")


def test_cancel_before_assignment_refunds_and_after_is_refused():
    s0 = genesis_state(G)
    p = post(s0)
    s = blocks(s0, [p])
    cancel = BatchCancel(G.domain, REQ.account, p.batch_id, 1).signed(REQ)
    stranger = BatchCancel(G.domain, WORKERS[0].account, p.batch_id, 0).signed(WORKERS[0])
    refused(s, stranger, "no such batch of yours")
    sc = blocks(s, [cancel], [])
    b = sc.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.CANCELLED and b.assigned == 0 and b.refunded == p.escrow()
    assert sc.account(REQ.account).balance == 1000 * C and sc.account(REQ.account).escrow == 0
    s = blocks(s, [])  # assigned
    refused(s, cancel, "only a batch with no item assigned can be cancelled")


def test_unbond_waits_for_undecided_assignments():
    s, p = posted(n=1)
    w = BY_ACCOUNT[item(s, p.batch_id, 0).workers[0]]
    refused(s, Unbond(G.domain, w.account, C, s.account(w.account).nonce).signed(w), "batch items assigned")


def test_batch_waits_for_enough_bonded_workers():
    s0 = genesis_state(G)
    refused(s0, post(s0, n=1, k=7, q=4), "only 6 bonded account.* k = 7 needs 7")  # only six opted-in workers
    p = post(s0, n=1, k=6, q=4)
    w = WORKERS[0]
    s = blocks(s0, [p], [BatchOffer(s0.chain_id, w.account, -1, 0).signed(w)])  # one withdraws before the draw
    b = s.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.OPEN and b.assigned == 0
    s = blocks(s, [BatchCancel(G.domain, REQ.account, p.batch_id, 1).signed(REQ)])
    assert s.tables["batches"][p.batch_id].status == BatchStatus.CANCELLED


def test_assignment_is_deterministic_and_depends_on_the_beacon():
    cands = [k.account for k in WORKERS]
    bid = b"b" * 16
    one = [br.draw(b"\x01" * 32, bid, i, 0, cands, 3, 2) for i in range(16)]
    assert one == [br.draw(b"\x01" * 32, bid, i, 0, list(reversed(cands)), 3, 2) for i in range(16)]
    other = [br.draw(b"\x02" * 32, bid, i, 0, cands, 3, 2) for i in range(16)]
    assert one != other
    assert len({w for i in range(16) for w in one[i][0]}) > 3  # draws differ per item
    assert br.draw(b"\x01" * 32, bid, 0, 0, cands[:2], 3, 2) == ((), 0)
    # the same blocks give the same assignment and the same root on two nodes
    s1, p = posted(n=3)
    s0 = genesis_state(G)
    s2 = blocks(s0, [p], [])
    assert s1.state_root() == s2.state_root()
    assert [item(s1, p.batch_id, i).workers for i in range(3)] == [item(s2, p.batch_id, i).workers for i in range(3)]


def test_adaptive_replication_lowers_k_toward_min_replication():
    cands = [k.account for k in WORKERS]
    bid, beacon = b"b" * 16, b"\x07" * 32
    full, q = br.draw(beacon, bid, 0, 0, cands, 3, 2)
    assert len(full) == 3 and q == 2
    assert br.draw(beacon, bid, 0, 0, cands, 3, 2, 2, lambda w: False) == (full, 2)
    assert br.draw(beacon, bid, 0, 0, cands, 3, 2, 2, lambda w: True) == (full[:2], 2)
    assert br.draw(beacon, bid, 0, 0, cands, 3, 2, 1, lambda w: True) == (full[:1], 1)
    assert br.draw(beacon, bid, 0, 0, cands, 3, 2, 1, lambda w: w == full[0]) == (full[:2], 2)
    five, q5 = br.draw(beacon, bid, 0, 0, cands, 5, 3, 2, lambda w: w in full[:2])
    assert five == tuple(br.draw(beacon, bid, 0, 0, cands, 5, 3)[0][:3]) and q5 == 2  # still one dissent tolerated
    # on the ledger: with adapt_step 1, a worker that agreed once is trusted; every worker agreeing once lowers k
    g = genesis(min_replication=2, adapt_step=1)
    s, p = posted(g, n=1)
    ws = [BY_ACCOUNT[w] for w in item(s, p.batch_id, 0).workers]
    s = blocks(s, [commit(s, p.batch_id, 0, w, A, g=g) for w in ws], g=g)
    s = blocks(s, [reveal(s, p.batch_id, 0, w, A, g=g) for w in ws], g=g)
    assert all(bm.reputation(s, w.account) == WorkerRecord(agreed=1, run=1, offer=0) for w in ws)
    p2 = post(s, g, n=6)
    s = blocks(s, [p2], [], g=g)
    sizes = [len(item(s, p2.batch_id, i).workers) for i in range(6)]
    for i in range(6):
        it = item(s, p2.batch_id, i)
        trusted = sum(1 for w in br.draw(s.last_hash, p2.batch_id, i, 0, [k.account for k in WORKERS], 3, 2)[0]
                      if w in {x.account for x in ws})
        assert len(it.workers) == max(2, 3 - trusted) and it.quorum == 2
    assert min(sizes) == 2


def test_new_params_keep_the_genesis_hash_and_are_checked():
    base = genesis()
    assert not {"batch_slash", "batch_absent_penalty", "min_replication"} & set(base.params.consensus_fields())
    assert genesis(min_replication=2).hash != base.hash
    from node.ledger.core.genesis import GenesisError
    with pytest.raises(GenesisError, match="batch_absent_penalty < batch_slash"):
        genesis(batch_absent_penalty=200 * C)
    with pytest.raises(GenesisError, match="min_replication"):
        genesis(min_replication=17)
    g = genesis(batch_slash=5 * C, batch_absent_penalty=C)
    assert br.slash_of(g.params) == 5 * C and br.absent_penalty_of(g.params) == C
    assert br.slash_of(base.params) == base.params.slash_amount
    assert br.absent_penalty_of(base.params) == base.params.job_start_penalty
    small = Params(sample_base_ppm=50_000, sample_floor_ppm=50_000, slash_amount=1000, max_receipt_price=10)
    small.check()  # a chain with a small slash and default batch params stays valid: the penalty is capped
    assert br.absent_penalty_of(small) == 500 < br.slash_of(small)


def test_state_root_covers_the_batch_tables_and_records_round_trip():
    s0 = genesis_state(G)
    root0 = s0.state_root()
    s, p = posted(n=2)
    assert s.state_root() != root0
    w = s.copy()
    w.tables["batches"][p.batch_id] = replace(w.tables["batches"][p.batch_id], paid=1)
    assert w.state_root() != s.state_root()
    w = s.copy()
    it = item(s, p.batch_id, 0)
    w.tables["batch_items"][item_key(p.batch_id, 0)] = replace(it, quorum=3)
    assert w.state_root() != s.state_root()
    for name, key in (("batches", p.batch_id), ("batch_items", item_key(p.batch_id, 1))):
        v = s.tables[name][key]
        assert CODECS[name].loads(CODECS[name].dumps(v)) == v
    decided = replace(it, status=ItemStatus.ACCEPTED, history=((0, it.workers[0], Fate.AGREED, PRICE),))
    assert CODECS["batch_items"].loads(CODECS["batch_items"].dumps(decided)) == decided


def test_batch_state_survives_a_real_leveldb_store(tmp_path):
    store = LedgerStore(tmp_path / "db", G)
    state = store.replay()
    p = post(state)
    offers = [BatchOffer(state.chain_id, w.account, 0, state.account(w.account).nonce).signed(w) for w in WORKERS]
    for txs in ([*offers, p], [], []):
        block, new, rejected = propose(state, txs, REQ, 1000 + state.height, store.last_commit())
        assert not rejected
        store.append(block, commit_block(REQ, block), state, new)
        state = new
    root, items = state.state_root(), [item(state, p.batch_id, i) for i in range(2)]
    store.close()
    store = LedgerStore(tmp_path / "db", G)
    again = store.replay()
    assert again.state_root() == root and [item(again, p.batch_id, i) for i in range(2)] == items
    assert list(open_batches(again)) == [p.batch_id]
    store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(["none", "commit", "A", "B"]), min_size=3, max_size=3),
                min_size=1, max_size=3))
def test_any_behaviour_conserves_credits_and_pays_only_the_quorum(plans):
    """Each worker of each item does nothing, commits only, or commits and reveals A or B; whatever they do,
    credits are conserved, every item is decided, and only a quorum's result is paid."""
    s, p = posted(n=len(plans), reissues=0, cw=1, rw=1)
    ws = {i: [BY_ACCOUNT[w] for w in item(s, p.batch_id, i).workers] for i in range(len(plans))}
    commits = [commit(s, p.batch_id, i, w, A if act != "B" else B)
               for i, plan in enumerate(plans) for w, act in zip(ws[i], plan, strict=True) if act != "none"]
    s = blocks(s, commits)
    reveals = [reveal(s, p.batch_id, i, w, A if act == "A" else B)
               for i, plan in enumerate(plans) for w, act in zip(ws[i], plan, strict=True) if act in ("A", "B")]
    s = blocks(s, reveals, [])
    b = s.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.SETTLED and b.escrow_left == 0
    want_paid = 0
    for i, plan in enumerate(plans):
        it = item(s, p.batch_id, i)
        nA, nB = plan.count("A"), plan.count("B")
        win = A if nA >= 2 else B if nB >= 2 else None
        assert (it.status == ItemStatus.ACCEPTED) == (win is not None) and (it.result or None) == win
        want_paid += PRICE * (max(nA, nB) if win else 0)
    assert b.paid == want_paid and b.paid + b.refunded == p.escrow()


def test_bench_verify_batch_prints_the_colluders_share_beside_the_estimates_and_audits_catching_them():
    """``bench/verify.py --batch`` (issue 14 check 3) through its command line: the measured share of items where two
    colluders of five hold the k = 3 majority lies within the 95 % interval of the exact hypergeometric 0.3 (the draw
    is deterministic given its beacons, so this cannot flake), and the binomial estimate is printed beside it."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "bench" / "verify.py"), "--batch", "--items", "800",
                        "--audit-items", "300", "--audit-ppm", "200000"],
                       capture_output=True, text=True, timeout=120, check=True)
    share = float(re.search(r"form the majority: ([0-9.]+)", r.stdout).group(1))
    hyper, half = (float(x) for x in re.search(r"hypergeometric .*?: ([0-9.]+) ± ([0-9.]+)", r.stdout).groups())
    assert hyper == 0.3 and abs(share - hyper) <= half
    assert "binomial (independent replicas, p = 0.4): 0.3520" in r.stdout
    # then the pair plays its cheat against audits at 20 %: the share of its won items overturned is the sampling
    # rate within the printed 95 % interval, and cheating loses credits on average
    m = re.search(r"items the pair won: (\d+); overturned by an audit: (\d+) \(([0-9.]+); sampling rate ([0-9.]+) "
                  r"± ([0-9.]+)", r.stdout)
    won, caught, share, rate, half = int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5])
    assert won > 50 and caught > 0 and rate == 0.2 and abs(share - rate) <= half
    gain = float(re.search(r"mean net gain per item it won: ([-+0-9.]+) credits", r.stdout).group(1))
    assert gain < 0


def test_a_worker_holds_at_most_batch_max_held_undecided_items_and_a_dead_one_is_drawn_for_ever_fewer():
    """With genesis ``batch_max_held`` = 2, items are drawn as workers finish others (never more than 2 undecided per
    worker), so every item's window need only hold two items' work; a worker that never commits has its limit
    halved per absence, to 1, and the batch still settles with every item accepted through the others, each agreeing
    worker paid exactly once per item, credits conserved after every block."""
    g = genesis(batch_max_held=2)
    dead = WORKERS[0].account
    s0 = genesis_state(g)
    p = post(s0, g, n=12, k=3, q=2, reissues=1, cw=3, rw=3)
    s = blocks(s0, [p], [], g=g)
    assert 3 <= s.tables["batches"][p.batch_id].assigned <= 4  # 6 workers × 2 slots / 3 replicas, not all 12
    limits, seen_held = [], 0
    for _ in range(200):
        b = s.tables["batches"][p.batch_id]
        if b.status == BatchStatus.SETTLED:
            break
        assert all(bm.held(s, w.account) <= 2 for w in WORKERS)  # no re-issue here (the others always agree)
        seen_held = max(seen_held, max(bm.held(s, w.account) for w in WORKERS if w.account != dead))
        limits.append(br.held_limit(g.params, bm.reputation(s, dead)))
        txs = []
        for i in range(b.assigned):
            it = item(s, p.batch_id, i)
            if it.status != ItemStatus.ASSIGNED:
                continue
            for w in it.workers:
                if w == dead:
                    continue
                if it.commitment_of(w) is None:
                    txs.append(commit(s, p.batch_id, i, BY_ACCOUNT[w], A, g=g))
                elif all(x != w for x, _ in it.reveals) and (
                        len(it.commits) == len(it.workers) or s.height + 1 > it.assigned_height + p.commit_window):
                    txs.append(reveal(s, p.batch_id, i, BY_ACCOUNT[w], A, g=g))
        s = blocks(s, txs, g=g)
    b = s.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.SETTLED and b.accepted == 12, b
    assert seen_held == 2
    assert limits[0] == 2 and limits[-1] == 1 and bm.reputation(s, dead).missed >= 1
    # every item paid its agreeing workers once; the dead worker paid nothing and lost its absent penalties
    paid = 0
    for i in range(12):
        it = item(s, p.batch_id, i)
        agreed = [(a, w) for a, w, f, _ in it.history if f == Fate.AGREED]
        assert len(agreed) == len(set(agreed)) == len(it.agreed) >= it.quorum and dead not in it.agreed
        paid += sum(x for _, _, f, x in it.history if f == Fate.AGREED)
    assert b.paid == paid and s.supply() == g.supply
    assert all(bm.held(s, w.account) == 0 for w in WORKERS)


def test_batch_max_held_is_optional_in_the_genesis_hash_and_checked():
    assert genesis().hash == genesis(batch_max_held=0).hash != genesis(batch_max_held=4).hash
    from node.ledger.core.genesis import GenesisError
    with pytest.raises(GenesisError, match="batch_max_held"):
        genesis(batch_max_held=2_000_000)


# ------------------------------------------------------------------ committee audits (node.ledger.core.batchaudit)

def drive(s, g, p, cheat: set, limit: int = 400):
    """Run batch ``p`` to settlement on the real state transition: every drawn worker commits and reveals (result
    ``X`` if it is in ``cheat``, else ``A``), every audit committee member votes the same way. Returns the state and
    the audit committees seen open."""
    from node.ledger.core.batchstate import AuditStatus
    from node.ledger.core.batchtx import BatchAuditVote

    committees = {}
    for _ in range(limit):
        b = s.tables["batches"][p.batch_id]
        if b.status == BatchStatus.SETTLED:
            return s, committees
        txs, nxt = [], s.height + 1
        for i in range(b.assigned):
            it = item(s, p.batch_id, i)
            if it.status == ItemStatus.ASSIGNED:
                for w in it.workers:
                    res = X if w in cheat else A
                    if it.commitment_of(w) is None:
                        txs.append(commit(s, p.batch_id, i, BY_ACCOUNT[w], res, g=g))
                    elif all(x != w for x, _ in it.reveals) and (
                            len(it.commits) == len(it.workers) or nxt > it.assigned_height + p.commit_window):
                        txs.append(reveal(s, p.batch_id, i, BY_ACCOUNT[w], res, g=g))
            elif it.audit == AuditStatus.OPEN:
                committees[i] = it.audit_committee
                for m in it.audit_committee:
                    if all(x != m for x, _ in it.audit_votes):
                        txs.append(BatchAuditVote(g.domain, m, p.batch_id, i, X if m in cheat else A)
                                   .signed(BY_ACCOUNT[m]))
        s = blocks(s, txs, g=g)
    raise AssertionError("batch not settled")


def test_an_audit_overturns_a_colluding_majority_slashes_it_and_vindicates_the_honest_dissenter():
    """Two of six workers share a wrong result X. With every accepted item audited (batch_audit_ppm = 10^6), each
    item where both were drawn (their X won 2 to 1 and the honest worker was slashed) is re-run by a committee of
    two others, who compute A: the audit overturns it (both colluders slashed, the honest dissenter's slash
    returned, the result becomes A, held by the dissenter and the committee). Items where one colluder was drawn
    are upheld or, if the other colluder sits on the committee, left undecided. Every item ends with A; credits
    are conserved after every block; votes from outside the committee, twice, or late are refused."""
    from node.ledger.core.batchstate import AuditStatus

    g = genesis(batch_audit_ppm=1_000_000)
    cheat = {WORKERS[0].account, WORKERS[1].account}
    s0 = genesis_state(g)
    p = post(s0, g, n=12, batch_id=b"\x07" * 16)
    s1 = blocks(s0, [p], [], g=g)
    bonds0 = {w.account: s1.account(w.account).bond for w in WORKERS}
    s, committees = drive(s1, g, p, cheat)
    b = s.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.SETTLED and b.accepted == 12 and b.auditing == 0
    majority = [i for i in range(12) if cheat <= set(item(s, p.batch_id, i).workers)]
    assert majority and b.overturned == len(majority), (majority, b.overturned)
    slashed = {w: 0 for w in bonds0}
    for i in range(12):
        it = item(s, p.batch_id, i)
        assert it.result == A and it.audit != AuditStatus.OPEN, (i, it.audit)
        assert not set(committees[i]) & (set(it.workers) | {REQ.account})  # nobody audits its own item
        fates = {w: f for _a, w, f, _x in it.history}
        if i in majority:
            assert it.audit == AuditStatus.OVERTURNED
            (honest,) = set(it.workers) - cheat
            assert fates[honest] == Fate.VINDICATED and all(fates[c] == Fate.OVERRULED for c in cheat)
            assert set(it.agreed) == {honest, *committees[i]}
        else:
            assert it.audit == (AuditStatus.UNDECIDED if set(committees[i]) & cheat else AuditStatus.UPHELD)
        for _a, w, f, x in it.history:
            slashed[w] += x if f in (Fate.DISSENTED, Fate.OVERRULED) else -x if f == Fate.VINDICATED else 0
    for w, b0 in bonds0.items():  # honest workers end with their whole bond; colluders lost a slash per wrong item
        assert s.account(w).bond == b0 - slashed[w]
        assert (slashed[w] > 0) == (w in cheat), (w in cheat, slashed[w])
    assert s.supply() == g.supply



def test_audit_votes_count_once_from_the_committee_within_the_verdict_timeout():
    from node.ledger.core.batchstate import AuditStatus
    from node.ledger.core.batchtx import BatchAuditVote

    g = genesis(batch_audit_ppm=1_000_000)
    s0 = genesis_state(g)
    p = post(s0, g, n=1, batch_id=b"\x09" * 16)
    s = blocks(s0, [p], [], g=g)
    ws = item(s, p.batch_id, 0).workers
    s = blocks(s, [commit(s, p.batch_id, 0, BY_ACCOUNT[w], A, g=g) for w in ws])
    s = blocks(s, [reveal(s, p.batch_id, 0, BY_ACCOUNT[w], A, g=g) for w in ws])
    it = item(s, p.batch_id, 0)
    assert it.status == ItemStatus.ACCEPTED and it.audit == AuditStatus.OPEN and len(it.audit_committee) == 2
    assert s.tables["batches"][p.batch_id].status == BatchStatus.RUNNING  # the audit keeps the batch open
    m0, m1 = (BY_ACCOUNT[m] for m in it.audit_committee)
    worker = BY_ACCOUNT[ws[0]]

    def vote(k, r=A, bid=p.batch_id):
        return BatchAuditVote(g.domain, k.account, bid, 0, r).signed(k)

    refused(s, vote(worker), "not on the item's audit committee")
    refused(s, vote(m0, bid=b"\x0a" * 16), "unknown batch item")
    s = blocks(s, [vote(m0)])
    refused(s, vote(m0, X), "already voted")
    late = s
    for _ in range(g.params.verdict_timeout):
        late = blocks(late, [])
    it = item(late, p.batch_id, 0)
    assert it.audit == AuditStatus.UNDECIDED  # one vote of two is not > 2/3 of the committee
    refused(late, vote(m1), "no open audit")
    assert late.tables["batches"][p.batch_id].status == BatchStatus.SETTLED
    s = blocks(s, [vote(m1)])  # the last vote closes the audit in its own block
    assert item(s, p.batch_id, 0).audit == AuditStatus.UPHELD
    assert s.tables["batches"][p.batch_id].status == BatchStatus.SETTLED


def test_audits_catch_a_colluding_pair_in_the_long_run_at_the_sampled_rate():
    """At batch_audit_ppm = 25 %, of the items where the colluding pair formed the majority, the share overturned
    is the sampling rate within a 4-sigma binomial band, and at least one is (so a colluder's expected gain per
    wrong item, the price, is set against 25 % of the slash; node.ledger.core.batchaudit). Audits of all accepted
    items are drawn at that rate too."""
    from node.ledger.core.batchstate import AuditStatus

    rate = 0.25
    g = genesis(batch_audit_ppm=int(rate * 1_000_000))
    cheat = {WORKERS[0].account, WORKERS[1].account}
    s0 = genesis_state(g)
    n = 80
    p = post(s0, g, n=n, batch_id=b"\x08" * 16, cw=2, rw=2)
    s, _ = drive(blocks(s0, [p], [], g=g), g, p, cheat, limit=600)
    items = [item(s, p.batch_id, i) for i in range(n)]
    majority = [it for it in items if cheat <= set(it.workers)]
    audited = [it for it in items if it.audit != AuditStatus.NONE]
    caught = [it for it in majority if it.audit == AuditStatus.OVERTURNED]
    # an audited item the pair won is overturned when its honest committee outnumbers the pair with the dissenter (a
    # committee of 2); with 1 member left eligible (dissents slashed honest bonds below min_bond) it ties, 2 to 2
    for it in majority:
        if it.audit != AuditStatus.NONE:
            assert it.audit == (AuditStatus.OVERTURNED if len(it.audit_committee) >= 2 else AuditStatus.UNDECIDED)
    assert all(it.audit != AuditStatus.OVERTURNED for it in items if not cheat <= set(it.workers))
    assert caught, "no colluding item audited"

    def band(k, m):
        sd = (rate * (1 - rate) / m) ** 0.5
        return abs(k / m - rate) <= 4 * sd

    assert band(len(audited), n), (len(audited), n)
    assert band(len(caught), len(majority)), (len(caught), len(majority))
    assert s.supply() == g.supply


def test_single_replica_items_are_audited_at_the_sampling_floor_and_a_lone_cheat_is_overturned():
    """Adaptive replication (min_replication 1, adapt_step 1) lets a batch of trusted workers be done by one replica
    per item; such an item is audited at least at sample_floor_ppm (here 1: every one) even with batch_audit_ppm 0,
    and a single replica's wrong result is overturned by its committee (2 votes against 1), its worker slashed."""
    from node.ledger.core.batchstate import AuditStatus

    g = genesis(min_replication=1, adapt_step=1, sample_base_ppm=1_000_000, sample_floor_ppm=1_000_000)
    s = genesis_state(g)
    pa = post(s, g, n=6, k=2, q=2, batch_id=b"\x0b" * 16)
    s, _ = drive(blocks(s, [pa], [], g=g), g, pa, set())  # every worker agrees: all become trusted
    assert all(item(s, pa.batch_id, i).audit == AuditStatus.NONE for i in range(6))  # two replicas: not sampled
    cheat = WORKERS[0].account
    pb = post(s, g, n=12, k=2, q=2, batch_id=b"\x0e" * 16)
    s, _ = drive(blocks(s, [pb], [], g=g), g, pb, {cheat})
    items = [item(s, pb.batch_id, i) for i in range(12)]
    assert all(len(it.workers) == 1 and it.quorum == 1 and it.result == A for it in items)
    mine = [it for it in items if it.workers == (cheat,)]
    assert mine and all(it.audit == AuditStatus.OVERTURNED for it in mine)
    for it in items:  # the cheat on a committee splits it (no 2/3 quorum of 2): nothing moves
        if it.workers != (cheat,):
            assert it.audit == (AuditStatus.UNDECIDED if cheat in it.audit_committee else AuditStatus.UPHELD)
    assert s.account(cheat).bond < 200 * C and s.supply() == g.supply
