"""Property tests (hypothesis) of the state transition over random transaction sequences.

Invariants: supply constant; no negative amount; a receipt, a verdict and a slash count once; replaying the
same blocks from genesis rebuilds exactly the same state.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from node.ledger.chain import check_and_apply, commit_block, propose
from node.ledger.state import genesis_state
from node.ledger.tx import ABSTAIN, INVALID, VALID, Bond, Transfer, Unbond

from .helpers import C, KEYS, VALIDATOR, make_genesis, make_receipt, vote

G = make_genesis(committee_size=2, challenge_window=2, verdict_timeout=3, max_rounds=2)

action = st.one_of(
    st.tuples(st.just("receipt"), st.integers(1, 4), st.sampled_from([0, 5, 6]), st.integers(1, 50)),
    st.tuples(st.just("transfer"), st.integers(0, 7), st.integers(0, 7), st.integers(1, 300)),
    st.tuples(st.just("vote"), st.integers(0, 40), st.integers(0, 7), st.sampled_from([VALID, INVALID, ABSTAIN])),
    st.tuples(st.just("resubmit"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("block"), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.sampled_from(["bond", "unbond"]), st.integers(0, 7), st.just(0), st.integers(1, 300)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, min_size=1, max_size=40))
def test_invariants_hold_over_random_sequences(actions):
    state = genesis_state(G)
    supply = state.supply()
    blocks = []
    pending, seen_receipts, seen_votes = [], [], []
    nonces = {k.account: 0 for k in KEYS}

    def close_block():
        nonlocal state, pending
        block, new, _rejected = propose(state, pending, VALIDATOR, len(blocks), blocks[-1][1] if blocks else ())
        blocks.append((block, commit_block(VALIDATOR, block)))
        state, pending = new, []

    for kind, a, b, c in actions:
        if kind == "receipt":
            r = make_receipt(G, KEYS[a], requester=KEYS[b], tokens=c, height=state.height)
            seen_receipts.append(r)
            pending.append(r)
        elif kind == "transfer":
            sender = KEYS[a]
            t = Transfer(G.chain_id, sender.account, KEYS[b].account, c * C, nonces[sender.account]).signed(sender)
            nonces[sender.account] += 1
            pending.append(t)
        elif kind in ("bond", "unbond"):
            sender = KEYS[a]
            cls = Bond if kind == "bond" else Unbond
            pending.append(cls(G.chain_id, sender.account, c * C, nonces[sender.account]).signed(sender))
            nonces[sender.account] += 1
        elif kind == "vote" and seen_receipts:
            r = seen_receipts[a % len(seen_receipts)]
            rec = state.receipts.get(r.id)
            v = vote(G, r.id, KEYS[b], c, rec.round if rec else 0)
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
    assert escrow_open == sum(a.escrow for a in state.accounts.values())
    # replay from genesis through the follower's checks rebuilds the same state
    replay = genesis_state(G)
    for block, commit in blocks:
        replay = check_and_apply(replay, block, commit)
    assert replay.state_root() == state.state_root() and replay.receipts == state.receipts
