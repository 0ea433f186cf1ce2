"""Property tests (hypothesis) of the state transition over random transaction sequences.

Invariants: supply constant; no negative amount; a receipt, a verdict and a slash count once; replaying the
same blocks from genesis rebuilds exactly the same state.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings, strategies as st

from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.core.jobstate import jobs_of
from node.ledger.core.jobtx import JobAccept, JobCancel, JobDeliver, JobPost, TrainReceipt
from node.ledger.core.state import genesis_state
from node.ledger.core.tx import ABSTAIN, INVALID, VALID, Bond, Transfer, Unbond

from .helpers import KEYS, VALIDATOR, C, make_genesis, make_receipt, vote

G = make_genesis(committee_size=2, challenge_window=2, verdict_timeout=3, max_rounds=2)

action = st.one_of(
    st.tuples(st.just("receipt"), st.integers(1, 4), st.sampled_from([0, 5, 6]), st.integers(1, 50)),
    st.tuples(st.just("transfer"), st.integers(0, 7), st.integers(0, 7), st.integers(1, 300)),
    st.tuples(st.just("vote"), st.integers(0, 40), st.integers(0, 7), st.sampled_from([VALID, INVALID, ABSTAIN])),
    st.tuples(st.just("resubmit"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("block"), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.sampled_from(["bond", "unbond"]), st.integers(0, 7), st.just(0), st.integers(1, 300)),
    st.tuples(st.just("job_post"), st.sampled_from([0, 0, 0, 5]), st.integers(1, 6), st.integers(1, 3)),
    *[st.tuples(st.sampled_from(["job_accept", "job_accept", "job_cancel", "job_deliver", "train", "train", "train"]),
                st.sampled_from([1, 2, 3, 4, 1, 2, 3, 4, 0, 6]), st.integers(0, 9),
                st.sampled_from([1_000_000, 2_000_000, 3_000_000, -1]))] * 3,
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, min_size=1, max_size=60))
def test_invariants_hold_over_random_sequences(actions):
    state = genesis_state(G)
    supply = state.supply()
    blocks = []
    pending, seen_receipts, seen_votes, jobs = [], [], [], []

    def nonce(k) -> int:  # what a wallet would use: the ledger's nonce plus this account's queued transactions
        return state.account(k.account).nonce + sum(
            1 for t in pending if getattr(t, "sender", None) == k.account and hasattr(t, "nonce"))

    def close_block():  # returns None, so ``close_block() or x`` is x
        nonlocal state, pending
        block, new, _rejected = propose(state, pending, VALIDATOR, len(blocks), blocks[-1][1] if blocks else ())
        blocks.append((block, commit_block(VALIDATOR, block)))
        state, pending = new, []

    # every sequence starts from two posted jobs, one of them accepted, so job flows are exercised too
    prefix = [("job_post", 0, 6, 2), ("job_post", 0, 4, 1), ("block", 0, 0, 0), ("job_accept", 1, 0, 0)]
    for i, (kind, a, b, c) in enumerate(prefix + list(actions)):
        if i % 4 == 3:  # blocks also close by themselves, so multi-step flows (post, accept, train) happen
            close_block()
        if kind == "receipt":
            r = make_receipt(G, KEYS[a], requester=KEYS[b], tokens=c, height=state.height)
            seen_receipts.append(r)
            pending.append(r)
        elif kind == "transfer":
            sender = KEYS[a]
            t = Transfer(G.domain, sender.account, KEYS[b].account, c * C, nonce(sender)).signed(sender)
            pending.append(t)
        elif kind == "job_post":
            sender = KEYS[a]
            tx = JobPost(G.domain, sender.account, bytes([len(jobs)]) * 16, "t", b"m" * 32, b"d" * 32, 4, "q_proj",
                         b, 2, 16, 1000, 0, c, C // 10, state.height + 30, 0, nonce(sender)).signed(sender)
            jobs.append(tx)
            pending.append(tx)
        elif (kind in ("job_accept", "job_cancel", "job_deliver", "train")
              and ((jobs and close_block()) or jobs_of(state))):
            # mostly a sensible action for a job in the right status, sometimes a wrong one (must be refused)
            want = {"job_accept": "open", "job_cancel": "open", "job_deliver": "accepted", "train": "accepted"}[kind]
            fit = [j for j in jobs_of(state).values() if j.status == want] or list(jobs_of(state).values())
            job = fit[b % len(fit)]
            keys = {k.account: k for k in KEYS}
            if kind == "job_accept":
                sender = KEYS[a] if a != job.post.sender else KEYS[(a % 4) + 1]
                pending.append(JobAccept(G.domain, sender.account, job.post.job_id, nonce(sender)).signed(sender))
            elif kind == "job_cancel":
                sender = keys[job.post.sender] if b % 3 else KEYS[a]
                pending.append(JobCancel(G.domain, sender.account, job.post.job_id, nonce(sender)).signed(sender))
            elif kind == "job_deliver":
                sender = keys.get(job.worker, KEYS[a])
                pending.append(JobDeliver(G.domain, sender.account, job.post.job_id, job.last_state or b"s" * 32,
                                          nonce(sender)).signed(sender))
            elif job.worker:
                w = keys[job.worker]
                end = min(job.post.steps, job.next_step + a % 3 + 1)
                r = TrainReceipt(G.domain, job.post.job_id, job.worker, job.post.sender, job.next_step, end,
                                 job.last_state or b"0" * 32, bytes([end]) * 32, b"b" * 32, c,
                                 (end - job.next_step) * job.post.price_per_step).signed(w)
                seen_receipts.append(r)
                pending.append(r)
        elif kind in ("bond", "unbond"):
            sender = KEYS[a]
            cls = Bond if kind == "bond" else Unbond
            pending.append(cls(G.domain, sender.account, c * C, nonce(sender)).signed(sender))
        elif kind == "vote" and seen_receipts:
            r = seen_receipts[a % len(seen_receipts)]
            rec = state.receipts.get(r.id)
            voter = KEYS[b]
            if rec is not None and rec.committee and b % 2:  # mostly the committee; sometimes anyone
                voter = next(k for k in KEYS if k.account == rec.committee[b % len(rec.committee)])
            v = vote(G, r.id, voter, c, rec.round if rec else 0)
            seen_votes.append(v)
            pending.append(v)
        elif kind == "resubmit" and (seen_receipts or seen_votes):
            old = (seen_receipts + seen_votes)[a % len(seen_receipts + seen_votes)]
            pending.append(old)
        elif kind == "block":
            close_block()
        for acc in state.accounts.values():
            assert min(acc.balance, acc.bond, acc.escrow) >= 0
    close_block()
    assert state.supply() == supply
    slashed_by_worker = {}
    for rec in state.receipts.values():
        slashed_by_worker[rec.receipt.worker] = slashed_by_worker.get(rec.receipt.worker, 0) + rec.slashed
        # each receipt pays out at most once: its payouts never exceed its price plus its slash
        assert sum(x for _, x in rec.payouts) <= rec.receipt.price + rec.slashed
    for w, total in slashed_by_worker.items():
        assert state.account(w).slashed == total
    escrow_open = sum(r.receipt.price for r in state.receipts.values() if r.receipt.id in state.open_receipts)
    escrow_jobs = sum(j.escrow_left for j in jobs_of(state).values())
    assert escrow_open + escrow_jobs == sum(a.escrow for a in state.accounts.values())
    for j in jobs_of(state).values():  # nothing is ever paid beyond a job's price
        event(f"job {j.status}, {len(j.segments)} segments")
        paid = sum(x for r in j.segments for acc, x in state.receipts[r].payouts if acc != j.post.sender)
        assert paid + j.escrow_left + j.refunded <= j.post.price + sum(state.receipts[r].slashed for r in j.segments)
    # replay from genesis through the follower's checks rebuilds the same state
    replay = genesis_state(G)
    for block, commit in blocks:
        replay = check_and_apply(replay, block, commit)
    assert replay.state_root() == state.state_root() and replay.receipts == state.receipts
