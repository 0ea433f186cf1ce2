"""Unit tests of the pure ledger state transition (node/ledger/state.py, chain.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from node.ledger.core.block import InvalidBlock
from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.core.state import INVALID_S, SAMPLED, SETTLED, VALID_S, apply_tx, genesis_state
from node.ledger.core.tx import ABSTAIN, INVALID, VALID, InvalidTx, Transfer
from node.ledger.genesis import TREASURY

from .helpers import CLIENT, KEYS, VALIDATOR, W1, C, make_genesis, make_receipt, vote


def run_blocks(state, *tx_batches):
    for txs in tx_batches:
        _block, state, rejected = propose(state, list(txs), VALIDATOR, 0, ())
        assert not rejected, rejected
    return state


def test_valid_verdict_pays_worker_and_committee_and_conserves_supply():
    g = make_genesis()
    s0 = genesis_state(g)
    r = make_receipt(g, W1)
    s = run_blocks(s0, [r], [])  # block 1 includes, block 2 draws the committee (p = 1)
    rec = s.receipts[r.id]
    assert rec.status == SAMPLED and len(rec.committee) == 2
    assert W1.account not in rec.committee and CLIENT.account not in rec.committee
    assert s.account(CLIENT.account).escrow == r.price
    members = {k.account: k for k in KEYS}
    s = run_blocks(s, [vote(g, r.id, members[m], VALID) for m in rec.committee])
    rec = s.receipts[r.id]
    assert rec.status == VALID_S
    fee = r.price * g.params.committee_fee_bps // 10_000
    assert s.account(W1.account).balance == s0.account(W1.account).balance + r.price - fee
    for m in rec.committee:
        assert s.account(m).balance == s0.account(m).balance + fee // 2
    assert s.account(CLIENT.account).balance == s0.account(CLIENT.account).balance - r.price
    assert s.account(CLIENT.account).escrow == 0
    assert s.supply() == s0.supply() == g.supply


def test_invalid_verdict_slashes_bond_once_and_refunds_requester():
    g = make_genesis()
    s0 = genesis_state(g)
    r = make_receipt(g, W1)
    s = run_blocks(s0, [r], [])
    members = {k.account: k for k in KEYS}
    com = s.receipts[r.id].committee
    s = run_blocks(s, [vote(g, r.id, members[m], INVALID) for m in com])
    rec = s.receipts[r.id]
    assert rec.status == INVALID_S and rec.slashed == g.params.slash_amount
    assert s.account(W1.account).bond == s0.account(W1.account).bond - g.params.slash_amount
    assert s.account(CLIENT.account).balance == s0.account(CLIENT.account).balance
    assert s.account(TREASURY).balance > 0
    assert s.supply() == g.supply
    # a resubmitted vote (the evidence again) is refused and changes nothing
    with pytest.raises(InvalidTx):
        apply_tx(s.copy(), vote(g, r.id, members[com[0]], INVALID))


def test_receipt_replay_other_chain_and_bad_signatures_refused():
    g = make_genesis()
    s = run_blocks(genesis_state(g), [make_receipt(g, W1)])
    r = make_receipt(g, W1)
    w = s.copy()
    apply_tx(w, r)
    prefix = replace(r, tokens=r.tokens - 1,
                     price=r.price - (r.span_end - r.span_start) * g.params.price_per_token_block)
    prefix = prefix.sign_worker(W1).countersign(CLIENT)
    for bad in (r,  # replay of the same receipt
                prefix,  # another receipt of the same session (e.g. an earlier, shorter one): paid once only
                make_receipt(g, W1, chain_id="other-chain"),
                replace(make_receipt(g, W1), requester_sig=b"\x00" * 64),
                make_receipt(g, W1, sign=False),
                replace(make_receipt(g, W1), price=1)):
        before = (dict(w.accounts), dict(w.receipts))
        with pytest.raises(InvalidTx):
            apply_tx(w, bad)
        assert (w.accounts, w.receipts) == before


def test_unbonded_worker_and_poor_requester_refused():
    g = make_genesis()
    s = genesis_state(g)
    with pytest.raises(InvalidTx, match="bonded"):
        apply_tx(s.copy(), make_receipt(g, KEYS[5]))
    with pytest.raises(InvalidTx, match="cover"):
        apply_tx(s.copy(), make_receipt(g, W1, requester=KEYS[6]))


def test_abstentions_escalate_and_never_penalise():
    g = make_genesis(max_rounds=2)
    s0 = genesis_state(g)
    r = make_receipt(g, W1)
    s = run_blocks(s0, [r], [])
    members = {k.account: k for k in KEYS}
    com = s.receipts[r.id].committee
    s = run_blocks(s, [vote(g, r.id, members[m], ABSTAIN) for m in com])
    # all voted, no quorum: next block escalates to a bigger committee (as many as are eligible)
    s = run_blocks(s, [])
    rec = s.receipts[r.id]
    assert rec.round == 1 and rec.status == SAMPLED and len(rec.committee) == 3
    s = run_blocks(s, [vote(g, r.id, members[m], ABSTAIN, 1) for m in rec.committee], [])
    rec = s.receipts[r.id]
    assert rec.status == "unverified"
    assert s.account(W1.account).bond == s0.account(W1.account).bond
    assert s.account(W1.account).balance == s0.account(W1.account).balance + r.price
    assert s.supply() == g.supply


def test_a_member_who_never_votes_is_left_out_of_the_next_committee():
    """A bonded account that is offline sat on every escalated committee: with three eligible accounts, a round-1
    committee of all three needs all three votes and never reached a quorum (seen in a training run with a
    killed worker). The member who did not vote in the round that timed out is not drawn again."""
    g = make_genesis(verdict_timeout=3, max_rounds=3)
    s0 = genesis_state(g)
    r = make_receipt(g, W1)
    s = run_blocks(s0, [r], [])
    members = {k.account: k for k in KEYS}
    com = s.receipts[r.id].committee
    assert len(com) == 2
    voter, silent = com
    s = run_blocks(s, [vote(g, r.id, members[voter], VALID)], *([[]] * g.params.verdict_timeout))
    rec = s.receipts[r.id]
    assert rec.round == 1 and rec.status == SAMPLED
    assert silent not in rec.committee and voter in rec.committee and len(rec.committee) == 2
    s = run_blocks(s, [vote(g, r.id, members[m], VALID, 1) for m in rec.committee])
    assert s.receipts[r.id].status == VALID_S
    assert s.supply() == g.supply


def test_unsampled_receipt_settles_after_challenge_window():
    g = make_genesis(sample_base_ppm=1, sample_floor_ppm=1, slash_amount=10**18)
    s0 = genesis_state(g)
    r = make_receipt(g, W1)
    s = run_blocks(s0, [r], *([[]] * g.params.challenge_window))
    assert s.receipts[r.id].status == SETTLED
    assert s.account(W1.account).balance == s0.account(W1.account).balance + r.price


def test_transfer_nonce_and_balance():
    g = make_genesis()
    s = genesis_state(g)
    a, b = KEYS[6], KEYS[7]
    t = Transfer(g.domain, CLIENT.account, a.account, 5 * C, 0).signed(CLIENT)
    apply_tx(s, t)
    with pytest.raises(InvalidTx, match="nonce"):
        apply_tx(s, t)
    with pytest.raises(InvalidTx, match="insufficient"):
        apply_tx(s, Transfer(g.domain, a.account, b.account, 6 * C, 0).signed(a))
    assert s.account(a.account).balance == 5 * C


def test_followers_check_blocks_and_commits():
    g = make_genesis()
    s0 = genesis_state(g)
    block, s1, _ = propose(s0, [make_receipt(g, W1)], VALIDATOR, 0, ())
    commit = commit_block(VALIDATOR, block)
    follower = check_and_apply(s0, block, commit)
    assert follower.state_root() == s1.state_root() and follower.last_hash == block.hash
    with pytest.raises(InvalidBlock):
        check_and_apply(s0, block, [(W1.account, 0, W1.sign(block.hash))])  # not a validator
    with pytest.raises(InvalidBlock):
        check_and_apply(s1, block, commit)  # wrong height


def test_unbond_waits_for_pending_receipts():
    from node.ledger.core.tx import Unbond

    g = make_genesis(sample_base_ppm=1, sample_floor_ppm=1, slash_amount=10**18)
    s0 = genesis_state(g)
    r = make_receipt(g, W1)
    s = run_blocks(s0, [r])
    with pytest.raises(InvalidTx, match="pending"):
        apply_tx(s.copy(), Unbond(g.domain, W1.account, 10 * C, 0).signed(W1))
    s = run_blocks(s, *([[]] * g.params.challenge_window))
    apply_tx(s, Unbond(g.domain, W1.account, 10 * C, 0).signed(W1))
    assert s.account(W1.account).bond == s0.account(W1.account).bond - 10 * C
    assert s.supply() == g.supply
