"""The job marketplace's state transition: escrow, acceptance, segment receipts, verdicts, delivery,
settlement, cancel, expiry, divergence, late receipts."""

from __future__ import annotations

import os

import pytest

from node.ledger.core.chain import propose
from node.ledger.core.jobstate import ACCEPTED, CANCELLED, DIVERGED, EXPIRED, FAILED, OPEN, SETTLED, jobs_of
from node.ledger.core.jobtx import JobAccept, JobCancel, JobDeliver, JobPost, TrainReceipt
from node.ledger.core.state import apply_tx, genesis_state
from node.ledger.core.tx import INVALID, VALID, InvalidTx

from .helpers import CLIENT, KEYS, VALIDATOR, W1, make_genesis, vote

G = make_genesis(committee_size=2)
PPS = 1_000_000  # base units per step


def post(s, steps=6, seg=2, deadline=50, nonce=None, job_id=None):
    tx = JobPost(G.domain, CLIENT.account, job_id or os.urandom(16), "hamlet <b>", b"m" * 32, b"d" * 32, 4,
                 "q_proj,v_proj", steps, 2, 16, 1000, 7, seg, PPS, deadline, 0,
                 s.account(CLIENT.account).nonce if nonce is None else nonce)
    return tx.signed(CLIENT)


def seg(job, start, end, before, after, loss=2_000_000, worker=W1):
    return TrainReceipt(G.domain, job.job_id, worker.account, CLIENT.account, start, end, before, after,
                        os.urandom(32), loss, (end - start) * PPS).signed(worker)


def blocks(s, *batches):
    for txs in batches:
        _, s, rejected = propose(s, list(txs), VALIDATOR, 0, ())
        assert not rejected, rejected
    return s


def run_valid(s, r):
    """Include ``r``, then let its committee vote valid."""
    s = blocks(s, [r], [])
    members = {k.account: k for k in KEYS}
    return blocks(s, [vote(G, r.id, members[m], VALID) for m in s.receipts[r.id].committee])


def test_full_lifecycle_pays_exactly_the_price():
    s0 = genesis_state(G)
    p = post(s0)
    s = blocks(s0, [p])
    assert jobs_of(s)[p.job_id].status == OPEN and s.account(CLIENT.account).escrow == p.price
    s = blocks(s, [JobAccept(G.domain, W1.account, p.job_id, 0).signed(W1)])
    assert jobs_of(s)[p.job_id].status == ACCEPTED
    states = [os.urandom(32) for _ in range(4)]
    for i in range(3):
        s = run_valid(s, seg(p, 2 * i, 2 * i + 2, states[i], states[i + 1]))
    s = blocks(s, [JobDeliver(G.domain, W1.account, p.job_id, states[3], 1).signed(W1)], [])
    job = jobs_of(s)[p.job_id]
    assert job.status == SETTLED and job.refunded == 0
    client_paid = s0.account(CLIENT.account).balance - s.account(CLIENT.account).balance
    assert client_paid == p.price and s.account(CLIENT.account).escrow == 0
    fees = p.price * G.params.committee_fee_bps // 10_000
    assert s.account(W1.account).balance - s0.account(W1.account).balance == p.price - fees
    assert s.supply() == G.supply
    # a late training receipt after settlement pays nothing more
    with pytest.raises(InvalidTx, match="settled"):
        apply_tx(s.copy(), seg(p, 6, 6 + 1, states[3], os.urandom(32)))


def test_cancel_before_acceptance_refunds_everything_and_not_after():
    s0 = genesis_state(G)
    p = post(s0)
    s = blocks(s0, [p], [JobCancel(G.domain, CLIENT.account, p.job_id, 1).signed(CLIENT)])
    assert jobs_of(s)[p.job_id].status == CANCELLED
    assert s.account(CLIENT.account).balance == s0.account(CLIENT.account).balance
    p2 = post(s)
    s = blocks(s, [p2], [JobAccept(G.domain, W1.account, p2.job_id, 0).signed(W1)])
    with pytest.raises(InvalidTx, match="only an open job"):
        apply_tx(s.copy(), JobCancel(G.domain, CLIENT.account, p2.job_id, s.account(CLIENT.account).nonce)
                 .signed(CLIENT))


def test_expiry_refunds_all_but_verified_segments():
    s0 = genesis_state(G)
    p = post(s0, deadline=12)
    s = blocks(s0, [p], [JobAccept(G.domain, W1.account, p.job_id, 0).signed(W1)])
    a, b = os.urandom(32), os.urandom(32)
    s = run_valid(s, seg(p, 0, 2, a, b))
    while s.height <= 12:
        s = blocks(s, [])
    job = jobs_of(s)[p.job_id]
    assert job.status == EXPIRED and job.refunded == p.price - 2 * PPS
    assert s0.account(CLIENT.account).balance - s.account(CLIENT.account).balance == 2 * PPS
    with pytest.raises(InvalidTx, match="expired"):
        apply_tx(s.copy(), seg(p, 2, 4, b, os.urandom(32)))
    assert s.supply() == G.supply


def test_invalid_segment_fails_job_slashes_and_refunds():
    s0 = genesis_state(G)
    p = post(s0)
    s = blocks(s0, [p], [JobAccept(G.domain, W1.account, p.job_id, 0).signed(W1)])
    r = seg(p, 0, 2, os.urandom(32), os.urandom(32))
    s = blocks(s, [r], [])
    members = {k.account: k for k in KEYS}
    s = blocks(s, [vote(G, r.id, members[m], INVALID) for m in s.receipts[r.id].committee])
    job = jobs_of(s)[p.job_id]
    assert job.status == FAILED
    assert s.account(CLIENT.account).balance == s0.account(CLIENT.account).balance  # everything back
    assert s.account(W1.account).bond == s0.account(W1.account).bond - G.params.slash_amount
    assert s.supply() == G.supply


def test_nan_loss_marks_job_diverged_and_refunds_unreserved():
    s0 = genesis_state(G)
    p = post(s0)
    s = blocks(s0, [p], [JobAccept(G.domain, W1.account, p.job_id, 0).signed(W1)])
    s = blocks(s, [seg(p, 0, 2, os.urandom(32), os.urandom(32), loss=-1)])
    job = jobs_of(s)[p.job_id]
    assert job.status == DIVERGED and job.refunded == p.price - 2 * PPS and job.losses == (-1,)


def test_bad_segments_are_refused():
    s0 = genesis_state(G)
    p = post(s0)
    s = blocks(s0, [p], [JobAccept(G.domain, W1.account, p.job_id, 0).signed(W1)])
    a, b = os.urandom(32), os.urandom(32)
    for bad in (seg(p, 1, 3, a, b),  # does not start where the job is
                seg(p, 0, 3, a, b),  # longer than segment_steps
                seg(p, 0, 2, a, b, worker=KEYS[2])):  # not the job's worker
        with pytest.raises(InvalidTx):
            apply_tx(s.copy(), bad)
    s = blocks(s, [seg(p, 0, 2, a, b)])
    with pytest.raises(InvalidTx, match="previous state_after"):
        apply_tx(s.copy(), seg(p, 2, 4, a, os.urandom(32)))
    with pytest.raises(InvalidTx, match="steps receipted"):
        apply_tx(s.copy(), JobDeliver(G.domain, W1.account, p.job_id, b, 1).signed(W1))
    assert jobs_of(s)[p.job_id].status == ACCEPTED


def test_posts_with_unknown_lora_targets_or_bad_segments_are_refused_with_the_reason():
    """A post naming a module peft cannot find would be accepted by a worker and then fail at every attempt;
    the ledger refuses it, and says why (as it does for segment_steps > steps)."""
    from dataclasses import replace as _replace

    s = genesis_state(G)
    good = post(s)
    for targets in ("nonsense_proj", "q_proj,", "q_proj,q_proj", "", "lm_head"):
        bad = _replace(good, targets=targets).signed(CLIENT)
        with pytest.raises(InvalidTx, match="targets must be distinct comma-separated names among q_proj"):
            apply_tx(s.copy(), bad)
    bad = _replace(good, steps=2, segment_steps=10).signed(CLIENT)
    with pytest.raises(InvalidTx, match=r"segment_steps in 1..steps \(got steps 2, segment_steps 10\)"):
        apply_tx(s.copy(), bad)
    ok = _replace(good, targets="q_proj, k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj").signed(CLIENT)
    apply_tx(s.copy(), ok)
