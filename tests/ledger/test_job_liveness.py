"""Marketplace liveness in the state transition: the start window, release, the bond-backed capacity bound, the
deadline maximum, and conservation of credits through all of them (real state transition, real signatures)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.core.jobstate import ACCEPTED, CANCELLED, OPEN, RELEASED, START_TIMEOUT, jobs_of, open_jobs
from node.ledger.core.jobtx import JobAccept, JobCancel, JobPost, JobRelease, TrainReceipt
from node.ledger.core.state import apply_tx, genesis_state
from node.ledger.core.tx import InvalidTx, Unbond, decode_tx
from node.ledger.genesis import TREASURY, GenesisError, Params

from .helpers import CLIENT, KEYS, VALIDATOR, W1, W2, C, make_genesis

WINDOW, START_PEN, RELEASE_PEN, MAX_DEADLINE = 5, 3 * C, C, 100
G = make_genesis(committee_size=2, job_start_window=WINDOW, job_start_penalty=START_PEN,
                 job_release_penalty=RELEASE_PEN, max_job_deadline=MAX_DEADLINE)
PPS = 1_000_000


def post(s, deadline=None, sender=CLIENT):
    deadline = s.height + 50 if deadline is None else deadline
    n = s.account(sender.account).nonce
    return JobPost(G.domain, sender.account, os.urandom(16), "t", b"m" * 32, b"d" * 32, 4, "q_proj,v_proj", 6, 2,
                   16, 1000, 7, 2, PPS, deadline, 0, n).signed(sender)


def accept(s, job, worker=W1, nonce=None):
    n = s.account(worker.account).nonce if nonce is None else nonce
    return JobAccept(G.domain, worker.account, job.job_id, n).signed(worker)


def release(s, job, worker=W1):
    return JobRelease(G.domain, worker.account, job.job_id, s.account(worker.account).nonce).signed(worker)


def segment(job, worker=W1, start=0, end=2):
    return TrainReceipt(G.domain, job.job_id, worker.account, CLIENT.account, start, end, os.urandom(32),
                        os.urandom(32), os.urandom(32), 2_000_000, (end - start) * PPS).signed(worker)


def block(s, *txs):
    _, s, rejected = propose(s, list(txs), VALIDATOR, 0, ())
    assert not rejected, rejected
    return s


def posted_and_accepted(worker=W1):
    s0 = genesis_state(G)
    p = post(s0)
    s = block(block(s0, p), accept(s0, p, worker))
    assert jobs_of(s)[p.job_id].status == ACCEPTED and jobs_of(s)[p.job_id].accepted_height == s.height
    return s0, s, p


def test_start_window_expiry_returns_the_job_to_open_and_slashes_the_start_penalty():
    s0, s, p = posted_and_accepted()
    accepted_at = s.height
    while s.height < accepted_at + WINDOW - 1:  # the last block of the window still belongs to the worker
        s = block(s)
        assert jobs_of(s)[p.job_id].status == ACCEPTED
    s = block(s)
    job = jobs_of(s)[p.job_id]
    assert s.height == accepted_at + WINDOW
    assert job.status == OPEN and job.worker == b"" and job.accepted_height == 0
    assert job.dropped == ((W1.account, START_TIMEOUT, s.height, START_PEN),)
    assert s.account(W1.account).bond == s0.account(W1.account).bond - START_PEN
    assert s.account(TREASURY).balance == s0.account(TREASURY).balance + START_PEN
    assert job.escrow_left == p.price and s.account(CLIENT.account).escrow == p.price  # the requester lost nothing
    assert s.supply() == G.supply
    with pytest.raises(InvalidTx, match="cannot accept it again"):  # no holding the same job window after window
        apply_tx(s.copy(), accept(s, p, W1))
    s = block(s, accept(s, p, W2))  # another worker takes it
    assert jobs_of(s)[p.job_id].worker == W2.account and jobs_of(s)[p.job_id].status == ACCEPTED


def test_a_first_segment_in_the_last_block_of_the_window_keeps_the_job():
    s0, s, p = posted_and_accepted()
    accepted_at = s.height
    while s.height < accepted_at + WINDOW - 1:
        s = block(s)
    s = block(s, segment(p))  # included in block accepted_at + WINDOW
    assert s.height == accepted_at + WINDOW
    for _ in range(2 * WINDOW):  # a started job is never taken back by the window
        s = block(s)
        assert jobs_of(s)[p.job_id].status == ACCEPTED and jobs_of(s)[p.job_id].worker == W1.account
    assert s.account(W1.account).bond == s0.account(W1.account).bond and jobs_of(s)[p.job_id].dropped == ()


def test_release_before_the_first_segment_costs_the_smaller_penalty():
    s0, s, p = posted_and_accepted()
    s = block(s, release(s, p))
    job = jobs_of(s)[p.job_id]
    assert job.status == OPEN and job.worker == b""
    assert job.dropped == ((W1.account, RELEASED, s.height, RELEASE_PEN),)
    assert s.account(W1.account).bond == s0.account(W1.account).bond - RELEASE_PEN
    assert RELEASE_PEN < START_PEN
    assert s.supply() == G.supply
    # back to open: the requester may now cancel it and gets everything back
    s = block(s, JobCancel(G.domain, CLIENT.account, p.job_id, s.account(CLIENT.account).nonce).signed(CLIENT))
    assert jobs_of(s)[p.job_id].status == CANCELLED
    assert s.account(CLIENT.account).balance == s0.account(CLIENT.account).balance


def test_release_is_refused_after_the_first_segment_and_for_anyone_else():
    s0, s, p = posted_and_accepted()
    with pytest.raises(InvalidTx, match="no accepted job of yours"):
        apply_tx(s.copy(), release(s, p, W2))
    s = block(s, segment(p))
    with pytest.raises(InvalidTx, match="has started"):
        apply_tx(s.copy(), release(s, p))
    q = post(s)
    s = block(s, q)
    with pytest.raises(InvalidTx, match="no accepted job of yours"):  # an open job is nobody's to release
        apply_tx(s.copy(), release(s, q))
    assert s.account(W1.account).bond == s0.account(W1.account).bond


def test_release_travels_as_a_transaction():
    _, s, p = posted_and_accepted()
    tx = release(s, p)
    assert decode_tx(tx.to_wire()) == tx
    with pytest.raises(InvalidTx, match="not a valid Ed25519 public key"):
        decode_tx({**tx.to_wire(), "f": [b"\xff" * 32, p.job_id, 0]})


def test_capacity_is_bounded_by_the_bond_covering_each_unstarted_job():
    s0 = genesis_state(G)
    # W1 keeps min_bond plus a little: its bond covers the start penalty of exactly 4 unstarted jobs
    keep = G.params.min_bond + START_PEN - 1
    assert keep // START_PEN == 4
    s = block(s0, Unbond(G.domain, W1.account, s0.account(W1.account).bond - keep, 0).signed(W1))
    posts = [post(s) for _ in range(6)]
    posts = [replace(p, nonce=s.account(CLIENT.account).nonce + i).signed(CLIENT) for i, p in enumerate(posts)]
    s = block(s, *posts)
    s = block(s, *[accept(s, p, W1, nonce=1 + i) for i, p in enumerate(posts[:4])])
    with pytest.raises(InvalidTx, match="covers the start penalty of 4 unstarted jobs and this worker holds 4"):
        apply_tx(s.copy(), accept(s, posts[4]))
    with pytest.raises(InvalidTx, match="keep covering the start penalty of the 4 job"):  # cannot unbond away
        apply_tx(s.copy(), Unbond(G.domain, W1.account, START_PEN, s.account(W1.account).nonce).signed(W1))
    s = block(s, segment(posts[0]))  # a started job no longer needs the collateral
    s = block(s, accept(s, posts[4]))
    assert jobs_of(s)[posts[4].job_id].worker == W1.account
    with pytest.raises(InvalidTx, match="holds 4"):
        apply_tx(s.copy(), accept(s, posts[5]))
    s = block(s, accept(s, posts[5], W2))  # other workers are not limited by W1's bond
    held = sum(1 for j in jobs_of(s).values() if j.worker == W1.account and j.status == ACCEPTED)
    assert held == 5 and s.supply() == G.supply


def test_deadline_beyond_the_genesis_maximum_is_refused_with_the_limit():
    s = genesis_state(G)
    height = s.height + 1  # the block that would include the post
    with pytest.raises(InvalidTx, match=rf"{MAX_DEADLINE + 1} blocks after the post; this chain allows at most "
                                        rf"max_job_deadline = {MAX_DEADLINE} blocks"):
        apply_tx(s.copy(), post(s, deadline=height + MAX_DEADLINE + 1))
    w = s.copy()
    apply_tx(w, post(s, deadline=height + MAX_DEADLINE))
    assert len(jobs_of(w)) == 1
    assert jobs_of(s) == {} and s.account(CLIENT.account) == genesis_state(G).account(CLIENT.account)  # nothing moved


@pytest.mark.parametrize("bad, why", [
    (dict(job_release_penalty=3 * C, job_start_penalty=3 * C), "job_release_penalty < job_start_penalty"),
    (dict(job_start_penalty=11 * C, min_bond=10 * C), "job_start_penalty <= min_bond"),
    (dict(job_start_window=0), "1 <= job_start_window"),
    (dict(job_start_window=200, max_job_deadline=100), "job_start_window <= max_job_deadline"),
])
def test_unsafe_liveness_parameters_are_refused(bad, why):
    with pytest.raises(GenesisError, match=why):
        Params(**{"slash_amount": 100 * C, "max_receipt_price": C, **bad}).check()


# ---------------------------------------------------------------- property: conservation and liveness

action = st.one_of(
    st.tuples(st.just("post"), st.integers(0, 4), st.integers(1, 120)),
    st.tuples(st.just("accept"), st.integers(1, 4), st.integers(0, 9)),
    st.tuples(st.just("release"), st.integers(1, 4), st.integers(0, 9)),
    st.tuples(st.just("train"), st.integers(0, 4), st.integers(0, 9)),
    st.tuples(st.just("unbond"), st.integers(1, 4), st.integers(1, 200)),
    st.tuples(st.just("block"), st.integers(0, 3), st.just(0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, min_size=1, max_size=50))
def test_credits_are_conserved_and_no_job_is_held_unstarted_past_its_window(actions):
    """Random posts, accepts, releases, first segments, unbonds and idle blocks (some of them invalid, which the
    proposer refuses): the supply never changes, escrow matches the jobs and receipts, no bond goes negative, every
    penalty reached the treasury, no job is ever held without a segment past its start window, and replaying the
    blocks through the follower's checks rebuilds the same state."""
    keys = {k.account: k for k in KEYS}
    state = genesis_state(G)
    blocks, pending = [], []

    def nonce(k):
        return state.account(k.account).nonce + sum(1 for t in pending if getattr(t, "sender", None) == k.account)

    def close():
        nonlocal state, pending
        blk, state, _ = propose(state, pending, VALIDATOR, len(blocks), blocks[-1][1] if blocks else ())
        blocks.append((blk, commit_block(VALIDATOR, blk)))
        pending = []
        for jid in open_jobs(state):
            j = jobs_of(state)[jid]
            if j.status == ACCEPTED and not j.segments:
                assert state.height < j.accepted_height + G.params.job_start_window, "held past its window"

    prefix = [("post", 0, 60), ("post", 0, 90), ("block", 0, 0), ("accept", 1, 0), ("accept", 2, 1), ("block", 0, 0)]
    for kind, a, b in prefix + actions:
        jobs = list(jobs_of(state).values())
        if kind == "post":
            k = KEYS[a]
            pending.append(JobPost(G.domain, k.account, os.urandom(16), "t", b"m" * 32, b"d" * 32, 4, "q_proj", 4,
                                   2, 16, 1000, 0, 2, PPS, state.height + b, 0, nonce(k)).signed(k))
        elif kind == "accept" and jobs:
            k, job = KEYS[a], jobs[b % len(jobs)]
            pending.append(JobAccept(G.domain, k.account, job.post.job_id, nonce(k)).signed(k))
        elif kind == "release" and jobs:
            job = jobs[b % len(jobs)]
            k = keys.get(job.worker, KEYS[a])
            pending.append(JobRelease(G.domain, k.account, job.post.job_id, nonce(k)).signed(k))
        elif kind == "train" and jobs:
            job = jobs[b % len(jobs)]
            k = keys.get(job.worker, KEYS[a])
            pending.append(TrainReceipt(G.domain, job.post.job_id, k.account, job.post.sender, job.next_step,
                                        job.next_step + 2, job.last_state or b"0" * 32, os.urandom(32), b"b" * 32,
                                        1_000_000, 2 * PPS).signed(k))
        elif kind == "unbond":
            k = KEYS[a]
            pending.append(Unbond(G.domain, k.account, b * C, nonce(k)).signed(k))
        else:
            for _ in range(a + 1):
                close()
        assert all(min(x.balance, x.bond, x.escrow) >= 0 for x in state.accounts.values())
    for _ in range(G.params.job_start_window + 1):  # let every window run out
        close()
    assert state.supply() == G.supply
    penalties = sum(d[3] for j in jobs_of(state).values() for d in j.dropped)
    slashes = sum(r.slashed for r in state.receipts.values())
    assert state.account(TREASURY).balance - genesis_state(G).account(TREASURY).balance == penalties + slashes
    bonds0 = sum(genesis_state(G).account(a).bond for a in keys)
    unbonded = sum(t.amount for blk, _ in blocks for t in blk.txs if isinstance(t, Unbond))
    assert bonds0 - sum(state.account(a).bond for a in keys) == penalties + slashes + unbonded  # bonds only paid these
    escrow_open = sum(r.receipt.price for r in state.receipts.values() if r.receipt.id in state.open_receipts)
    assert escrow_open + sum(j.escrow_left for j in jobs_of(state).values()) == sum(
        x.escrow for x in state.accounts.values())
    for j in jobs_of(state).values():
        event(f"job {j.status}, {len(j.segments)} segments, dropped: {sorted(d[1] for d in j.dropped)}")
        assert len({d[0] for d in j.dropped}) == len(j.dropped)  # no worker lost the same job twice
    replay = genesis_state(G)
    for blk, commit in blocks:
        replay = check_and_apply(replay, blk, commit)
    assert replay.state_root() == state.state_root() and jobs_of(replay) == jobs_of(state)
