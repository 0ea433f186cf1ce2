"""Guards of settlement and sampling that no test pinned (issue 35, check 2: mutation testing).

Each test here fails on one mutant of the ledger core and passes on the real code. With each mutant, all of
tests/ledger and the default and slow tests that vote on receipts (among them the real-node dispute and the
devnet fault switch) still passed, unless said otherwise:

* a vote on a receipt that is already final was applied: the worker paid twice, the requester's escrow negative
  (``receipts._apply_vote`` without its ``status == SAMPLED`` check; the supply check does not see it);
* a vote from an account outside the receipt's committee was counted (without the membership check);
* the end-of-block draw used a fixed beacon instead of the hash of the block after inclusion (predictable);
* an invalid verdict left the worker's run of valid verdicts, so its sampling rate stayed low after it cheated;
* the worker left out of the exclusions of its own receipt's committee (other tests catch it only by chance, each
  with probability 1/2);
* a training run returned its escrow while its aggregate still awaited a verdict: once voted invalid, the
  aggregate's price stayed in the sponsor's escrow for good.

Pure state-machine tests: blocks are applied with :func:`apply_block_body` and a chosen block hash (the beacon).
"""

from __future__ import annotations

import pytest

from node.encoding import H
from node.ledger.core.runs import Phase, RunStatus
from node.ledger.core.sampling import is_sampled
from node.ledger.core.state import (
    INVALID_S,
    PENDING,
    SAMPLED,
    UNVERIFIED,
    VALID_S,
    apply_block_body,
    apply_tx,
    genesis_state,
)
from node.ledger.core.tx import INVALID, VALID, InvalidTx
from node.ledger.genesis import Genesis, Params

from .helpers import CLIENT, KEYS, W1, C, make_genesis, make_receipt, vote
from .test_runs import BY_ACCOUNT, SPONSOR, Chain, start

MEMBERS = {k.account: k for k in KEYS}


def block(s, txs=(), beacon: bytes | None = None):
    """Apply ``txs`` as the next block, whose hash (the beacon of its end-of-block draws) is ``beacon``."""
    h = s.height + 1
    return apply_block_body(s, h, beacon or H(b"block", h.to_bytes(8, "big")), list(txs))


def rid(*parts) -> bytes:
    return H(b"session", *parts)[:16]


def wide_genesis(**params) -> Genesis:
    """KEYS[0] is the validator and requester; KEYS[1..7] are bonded: a committee of 4 can be drawn."""
    p = Params(**{"block_time_ms": 100, "price_per_token_block": 1000, "max_receipt_price": C,
                  "slash_amount": 100 * C, **params})
    p.check()
    bal = [(KEYS[0].account, 1000 * C, 0)] + [(KEYS[i].account, 100 * C, 200 * C) for i in range(1, 8)]
    return Genesis("test-chain", 0, (KEYS[0].account,), tuple(bal), p)


def refused(s, tx, match: str):
    """``tx`` is refused with ``match`` and changes nothing."""
    w = s.copy()
    before = (dict(w.accounts), dict(w.receipts))
    with pytest.raises(InvalidTx, match=match):
        apply_tx(w, tx)
    assert (w.accounts, w.receipts) == before


def test_a_late_vote_on_a_receipt_already_voted_valid_is_refused_and_pays_nobody_twice():
    g = wide_genesis(committee_size=4)
    s0 = genesis_state(g)
    r = make_receipt(g, W1, rid=rid(b"late-valid"))
    s = block(block(s0, [r]))
    com = s.receipts[r.id].committee
    assert len(com) == 4 and W1.account not in com
    s = block(s, [vote(g, r.id, MEMBERS[m], VALID) for m in com[:3]])  # 3 of 4: > 2/3, final
    assert s.receipts[r.id].status == VALID_S
    worker_balance = s.account(W1.account).balance
    assert s.account(CLIENT.account).escrow == 0 and s.supply() == g.supply
    late = vote(g, r.id, MEMBERS[com[3]], VALID)  # the fourth member's vote, arriving after the verdict
    refused(s, late, "not awaiting votes")
    with pytest.raises(InvalidTx):
        block(s, [late])
    assert s.account(W1.account).balance == worker_balance


def test_a_late_vote_on_a_receipt_settled_unverified_is_refused_and_pays_nobody_twice():
    g = make_genesis(max_rounds=1, verdict_timeout=2)
    s0 = genesis_state(g)
    r = make_receipt(g, W1, rid=rid(b"late-unverified"))
    s = block(block(s0, [r]))
    voter, silent = s.receipts[r.id].committee
    s = block(s, [vote(g, r.id, MEMBERS[voter], VALID)])
    while s.receipts[r.id].status == SAMPLED:  # no quorum within verdict_timeout, no further round: unverified
        s = block(s)
    assert s.receipts[r.id].status == UNVERIFIED
    assert s.account(W1.account).balance == s0.account(W1.account).balance + r.price  # paid once, unchecked
    refused(s, vote(g, r.id, MEMBERS[silent], VALID), "not awaiting votes")


def test_only_the_receipts_committee_votes():
    g = make_genesis()
    s0 = genesis_state(g)
    r = make_receipt(g, W1, rid=rid(b"outsider"))
    s = block(block(s0, [r]))
    com = s.receipts[r.id].committee
    outsider = next(k for k in KEYS[2:5] if k.account not in com)  # bonded, eligible, not drawn for this receipt
    assert s.account(outsider.account).bond >= g.params.min_bond
    for who in (outsider, W1, CLIENT):  # a bonded outsider, the worker itself, the requester
        refused(s, vote(g, r.id, who, INVALID), "not on this receipt's committee")
    # one member's INVALID with an outsider's would have been a quorum of "2 of 2" and slashed an honest worker
    with pytest.raises(InvalidTx, match="committee"):
        block(s, [vote(g, r.id, MEMBERS[com[0]], INVALID), vote(g, r.id, outsider, INVALID)])
    s = block(s, [vote(g, r.id, MEMBERS[m], VALID) for m in com])
    assert s.receipts[r.id].status == VALID_S and s.account(W1.account).bond == s0.account(W1.account).bond


def test_the_sampling_draw_follows_the_hash_of_the_block_after_inclusion():
    """p = 1/2: which of 32 receipts are sampled is exactly what ``is_sampled`` gives for the beacon (the hash of
    the block after the receipts' block), and another beacon gives another set."""
    ppm = 500_000
    g = make_genesis(sample_base_ppm=ppm, sample_floor_ppm=ppm)
    rs = [make_receipt(g, W1, rid=rid(b"draw", bytes([i]))) for i in range(32)]
    s1 = block(genesis_state(g), rs)
    drawn = []
    for beacon in (H(b"beacon A"), H(b"beacon B")):
        s = block(s1, beacon=beacon)
        want = {r.id for r in rs if is_sampled(beacon, r.id, ppm)}
        got = {r.id for r in rs if s.receipts[r.id].status == SAMPLED}
        assert 0 < len(want) < len(rs) and got == want
        assert all(s.receipts[r.id].status == PENDING and s.receipts[r.id].p_ppm == ppm for r in rs if r.id not in got)
        drawn.append(got)
    assert drawn[0] != drawn[1]


def test_the_worker_is_never_on_its_own_receipts_committee():
    g = make_genesis()  # bonded: W1 (the worker) and three others; committees of 2
    rs = [make_receipt(g, W1, rid=rid(b"own", bytes([i]))) for i in range(24)]
    s = block(block(genesis_state(g), rs))
    for r in rs:
        com = s.receipts[r.id].committee
        assert len(com) == 2 and W1.account not in com and CLIENT.account not in com


def test_an_invalid_verdict_resets_the_workers_run_of_valid_verdicts_and_its_sampling_rate():
    """adapt_step = 1: one valid verdict halves the worker's sampling rate; an invalid one puts it back to the
    base rate (BOINC adaptive replication: an invalid result resets the run)."""
    g = make_genesis(sample_base_ppm=1_000_000, sample_floor_ppm=250_000, adapt_step=1)
    s = genesis_state(g)

    def judged(s, tag: bytes, verdict: int):
        r = make_receipt(g, W1, rid=rid(tag), height=s.height)
        s = block(s, [r])
        ppm = 1_000_000 >> s.account(W1.account).valid_run
        beacon = next(b for i in range(64) if is_sampled(b := H(tag, bytes([i])), r.id, ppm))
        s = block(s, beacon=beacon)  # a beacon that samples it, at the worker's current rate
        assert s.receipts[r.id].status == SAMPLED and s.receipts[r.id].p_ppm == ppm
        s = block(s, [vote(g, r.id, MEMBERS[m], verdict) for m in s.receipts[r.id].committee])
        return s, s.receipts[r.id]

    s, rec = judged(s, b"first", VALID)
    assert rec.status == VALID_S and rec.p_ppm == 1_000_000 and s.account(W1.account).valid_run == 1
    s, rec = judged(s, b"second", INVALID)
    assert rec.status == INVALID_S and rec.p_ppm == 500_000  # checked at half the rate after one valid verdict
    assert s.account(W1.account).valid_run == 0
    s, rec = judged(s, b"third", VALID)
    assert rec.p_ppm == 1_000_000  # back to the base rate after the cheat


def test_an_expired_run_keeps_its_escrow_until_its_pending_aggregate_has_a_verdict():
    c = Chain()
    post = start(c, rounds=1, deadline=c.s.height + 8)
    cur = c.run(post).cur
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in cur.participants])
    c.block(*[c.reveal(post, BY_ACCOUNT[w]) for w in cur.participants])
    cur = c.run(post).cur
    votes = [v for _, rid_, _ in cur.commits if c.s.receipts[rid_].status == SAMPLED for v in c.votes(rid_, VALID)]
    if votes:
        c.block(*votes)
    a = c.aggregate(post, list(cur.participants))
    c.block(a)
    assert c.run(post).cur.phase == Phase.CHECK
    c.block()
    assert c.s.receipts[a.id].status == SAMPLED  # its committee never votes before the deadline
    for _ in range(12):  # past the deadline, and past every round receipt's challenge window
        c.block()
    run = c.run(post)
    assert run.status == RunStatus.EXPIRED and c.s.receipts[a.id].status == SAMPLED
    assert all(c.s.receipts[x].status != SAMPLED for x in run.receipts if x != a.id)
    assert not run.final_height  # the aggregate's verdict decides where its price goes: nothing returned yet
    c.block(*c.votes(a.id, INVALID))
    assert c.s.receipts[a.id].status == INVALID_S
    c.block()
    run = c.run(post)
    assert run.final_height and run.escrow_left == 0
    assert c.s.account(SPONSOR.account).escrow == 0  # the aggregate's price came back too
    assert run.paid_aggregators == 0
