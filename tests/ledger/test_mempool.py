"""Mempool admission against a real LevelDB ledger: who may queue what, the reason of every refusal, the caps,
the priority of work over transfers in a full pool, memory bounds, and one signature check per transaction.

Blocks are produced the way a validator produces them (:meth:`ConsensusDriver._get_value` builds the proposal
from the mempool, :meth:`LedgerService.commit_decided` stores it), on a store in a tmp dir."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import trio

import node.keys
import node.ledger.core.block
import node.ledger.core.txbase
from node.encoding import pack
from node.identity import Identity, dev_seed
from node.ledger.core.batchtx import BatchPost
from node.ledger.core.block import Block, Header, InvalidBlock, tx_root
from node.ledger.core.chain import check_and_apply, check_block, commit_block, propose
from node.ledger.core.runstate import runs_of
from node.ledger.core.runtx import RunJoin, RunLeave, RunPost
from node.ledger.core.state import SAMPLED, genesis_state
from node.ledger.core.tx import Bond, InvalidTx, Transfer, Unbond
from node.ledger.mempool import Mempool
from node.ledger.mempool_policy import Limits, Priority, cost, is_free, priority
from node.ledger.service import LedgerService
from node.ledger.store import LedgerStore

from .helpers import CLIENT, KEYS, VALIDATOR, W1, W2, W3, W4, C, make_genesis, make_receipt, vote

A, B, D = KEYS[5], KEYS[6], KEYS[7]  # funded with 100 credits each, no bond (never on a committee)
NOBODY = Identity.from_seed(dev_seed(99))  # a fresh key: no balance, no bond


def genesis(**params):
    g = make_genesis(**params)
    return replace(g, balances=g.balances + tuple((k.account, 100 * C, 0) for k in (A, B, D)))


@pytest.fixture
def make_svc(tmp_path):
    stores = []

    def make(**limits) -> LedgerService:
        g = genesis()
        store = LedgerStore(tmp_path / f"db{len(stores)}", g)
        stores.append(store)
        return LedgerService(store, g, VALIDATOR, host=None, mempool_limits=Limits(**limits))

    yield make
    for s in stores:
        s.close()


async def produce(svc: LedgerService) -> Block:
    """One block, as the validator's consensus builds and stores it."""
    value = svc.driver._get_value(svc.state.height + 1)
    block, new_state = svc.driver.blocks[value]
    assert await svc.commit_decided(block, commit_block(VALIDATOR, block), new_state)
    return block


DOMAIN = genesis().domain  # the signing domain of make_svc's ledgers: chain id and genesis hash


def pay(who: Identity, nonce: int, amount: int = C, to: Identity = W1, chain: str = DOMAIN) -> Transfer:
    return Transfer(chain, who.account, to.account, amount, nonce).signed(who)


def refused(svc: LedgerService, tx, match: str) -> str:
    before = dict(svc.mempool)
    with pytest.raises(InvalidTx, match=match) as e:
        svc.add_tx(tx)
    assert dict(svc.mempool) == before  # a refusal changes nothing
    assert svc.rejected[tx.id] == str(e.value)  # and its reason is kept
    return str(e.value)


def test_unfunded_sender_is_refused_with_the_reason(make_svc):
    svc = make_svc()
    why = refused(svc, pay(NOBODY, 0), "insufficient balance")
    assert "0 available" in why
    refused(svc, pay(NOBODY, 3), "insufficient balance")  # ahead of its nonce: must be able to pay as well
    refused(svc, Unbond(DOMAIN, NOBODY.account, C, 2).signed(NOBODY), "holds no credits")
    refused(svc, pay(CLIENT, 0, chain="other-chain"), "chain")
    assert len(svc.mempool) == 0 and svc.mempool.stats["refused"] == 4


def test_far_future_nonce_is_refused_and_a_used_one_too(make_svc):
    svc = make_svc()
    window = svc.mempool.limits.nonce_window
    why = refused(svc, pay(CLIENT, window), "too far ahead")
    assert f"next nonce is 0; at most {window - 1}" in why
    svc.add_tx(pay(CLIENT, window - 1))  # the edge of the window: queued, waiting for its predecessors
    assert len(svc.mempool) == 1 and svc.candidates() == []
    svc.add_tx(pay(CLIENT, 0))
    trio.run(produce, svc)
    refused(svc, pay(CLIENT, 0, amount=2 * C), "already used")
    svc.add_tx(pay(CLIENT, 1))
    refused(svc, pay(CLIENT, 1, amount=2 * C), "with this nonce is queued")


def test_nonces_within_the_window_wait_and_then_land_in_order(make_svc):
    svc = make_svc()
    t2, t1, t0 = pay(A, 2, 10 * C), pay(A, 1, 20 * C), pay(A, 0, 30 * C)
    svc.add_tx(t2)
    svc.add_tx(t1)
    assert len(svc.mempool) == 2 and svc.candidates() == [] and svc.next_nonce(A.account) == 0
    svc.add_tx(t0)  # fills the gap: all three are ready, in nonce order
    assert svc.candidates() == [t0, t1, t2] and svc.next_nonce(A.account) == 3
    block = trio.run(produce, svc)
    assert list(block.txs) == [t0, t1, t2] and len(svc.mempool) == 0
    refusals = svc.mempool.stats["refused"]
    assert svc.add_tx(t1) == t1.id and len(svc.mempool) == 0  # a second copy of an included one: a no-op
    assert svc.mempool.stats["refused"] == refusals
    assert svc.state.account(A.account).balance == 40 * C and svc.state.account(A.account).nonce == 3


def test_queued_transactions_ahead_must_all_be_covered_by_the_balance(make_svc):
    svc = make_svc()
    svc.add_tx(pay(A, 1, 40 * C))
    svc.add_tx(pay(A, 2, 40 * C))
    why = refused(svc, pay(A, 3, 40 * C), "insufficient balance")
    assert f"{120 * C} base units needed with the sender's queued transactions, {100 * C}" in why
    svc.add_tx(Bond(DOMAIN, A.account, 20 * C, 3).signed(A))  # 100 credits cover 40 + 40 + 20


def test_transactions_waiting_for_a_gap_expire_with_a_reason(make_svc):
    svc = make_svc(future_ttl_blocks=3)
    t = pay(A, 1)
    svc.add_tx(t)

    async def main():
        for _ in range(2):
            await produce(svc)
        assert t.id in svc.mempool
        await produce(svc)

    trio.run(main)
    assert t.id not in svc.mempool and "waited 3 blocks for nonce 0" in svc.rejected[t.id]
    assert svc.mempool.stats["expired"] == 1


def test_per_sender_cap_counts_every_kind_the_account_pays(make_svc):
    svc = make_svc(max_per_sender=4)
    g = svc.genesis
    for n in range(3):
        svc.add_tx(pay(CLIENT, n))
    svc.add_tx(make_receipt(g, W1))  # CLIENT is its requester: the fourth transaction CLIENT pays for
    why = refused(svc, pay(CLIENT, 3), "has 4 transactions queued")
    assert "at most 4" in why
    refused(svc, make_receipt(g, W2), "has 4 transactions queued")
    svc.add_tx(pay(A, 0))  # other senders are not affected
    assert len(svc.mempool) == 5


def test_a_full_pool_evicts_transfers_before_receipts_and_votes(make_svc):
    svc = make_svc(max_txs=8, account_share_pct=50)
    g = svc.genesis

    async def main():
        sampled = [make_receipt(g, W1), make_receipt(g, W2)]
        for r in sampled:
            svc.add_tx(r)
        await produce(svc)  # includes them
        await produce(svc)  # its hash samples them (sample_base_ppm is 100 %) and draws committees
        return sampled

    sampled = trio.run(main)
    members = {k.account: k for k in KEYS}
    votes = [vote(g, r.id, members[m], 0) for r in sampled for m in svc.state.receipts[r.id].committee]
    assert all(svc.state.receipts[r.id].status == SAMPLED for r in sampled) and len(votes) == 4

    ready = [pay(A, 0), pay(B, 0)]
    gapped = [pay(D, 3), pay(D, 4)]
    for t in ready + gapped:
        svc.add_tx(t)
    refused(svc, pay(CLIENT, 2), "mempool full for account transactions")  # transfers get half the pool
    receipts = [make_receipt(g, w, height=svc.state.height) for w in (W1, W2, W3, W4)]
    for r in receipts:
        svc.add_tx(r)  # work may use the rest
    assert len(svc.mempool) == 8 and svc.mempool.count(Priority.WORK) == 4
    svc.add_tx(votes[0])
    svc.add_tx(votes[1])  # the pool is full: the transfers waiting for a gap go first (highest nonce first)
    assert {t for t in svc.mempool.values() if isinstance(t, Transfer)} == set(ready)
    assert "evicted" in svc.rejected[gapped[0].id]
    svc.add_tx(votes[2])
    svc.add_tx(votes[3])  # then the ready transfers
    assert svc.mempool.count(Priority.ACCOUNT) == 0 and svc.mempool.count(Priority.WORK) == 8
    assert svc.mempool.stats["evicted"] == 4
    refused(svc, make_receipt(g, W3, height=svc.state.height), r"mempool full \(8 transactions")  # work is full
    block = trio.run(produce, svc)  # what remains is the work, and it lands
    assert set(block.txs) == set(receipts + votes) and len(svc.mempool) == 0
    assert svc.state.account(A.account).nonce == 0  # the evicted transfer did not apply


def test_a_ready_transfer_takes_the_place_of_one_waiting_for_a_gap(make_svc):
    svc = make_svc(max_txs=4, account_share_pct=50)
    waiting = [pay(D, 3), pay(D, 4)]
    for t in waiting:
        svc.add_tx(t)
    refused(svc, pay(A, 2), "mempool full for account transactions")  # waiting ones evict nothing
    svc.add_tx(pay(A, 0))  # one that applies now evicts D's highest nonce
    assert set(svc.mempool) == {waiting[0].id, pay(A, 0).id} and "evicted" in svc.rejected[waiting[1].id]


def test_memory_is_bounded_in_bytes(make_svc):
    svc = make_svc(max_bytes=4000)
    g = svc.genesis
    size = len(pack(make_receipt(g, W1).to_wire()))
    n = 0
    with pytest.raises(InvalidTx, match="mempool full"):
        for _ in range(100):
            svc.add_tx(make_receipt(g, W1))
            n += 1
    assert n == 4000 // size and svc.mempool.size_bytes <= 4000


def test_signatures_are_checked_once_per_transaction_not_per_block(make_svc, monkeypatch):
    calls = []
    real = node.keys.verify

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(node.keys, "verify", counting)  # what verify_many (block building) calls
    monkeypatch.setattr(node.ledger.core.txbase, "verify", counting)  # what Tx.check_signatures calls
    svc = make_svc()
    g = svc.genesis
    s0 = genesis_state(g)  # the state before block 1 (svc.state is replaced by each committed block)
    txs = [pay(A, 0), pay(B, 0), make_receipt(g, W1), make_receipt(g, W2)]
    waiting = pay(D, 5)  # stays in the pool for every block below
    for t in txs + [waiting]:
        svc.add_tx(t)
    assert len(calls) == 2 + 2 * 2 + 1  # one per signature: transfers have one, receipts two
    blocks = []

    async def main():
        for _ in range(4):
            blocks.append(await produce(svc))

    trio.run(main)
    assert set(blocks[0].txs) == set(txs) and waiting.id in svc.mempool
    assert len(calls) == 7  # four blocks built and stored, the waiting one re-checked in none of them

    # another node validating that block verifies every signature in it
    check_and_apply(s0, blocks[0], commit_block(VALIDATOR, blocks[0]))
    assert len(calls) == 7 + 6
    # the cache names the exact signed object: the same id with another signature is not "verified"
    forged = replace(waiting, sig=bytes(64))
    assert forged.id == waiting.id and svc.mempool.verified(waiting) and not svc.mempool.verified(forged)
    st = svc.state
    header = Header(st.chain_id, st.height + 1, st.last_hash, 10**6, VALIDATOR.account, tx_root([forged]),
                    st.state_root())
    bad = Block(header, (forged,), svc.store.last_commit())
    with pytest.raises(InvalidBlock, match="bad transfer signature"):
        check_and_apply(st, bad, commit_block(VALIDATOR, bad))
    with pytest.raises(InvalidTx, match="bad transfer signature"):
        svc.add_tx(replace(pay(D, 0), sig=bytes(64)))  # and admission refuses a bad signature


def test_refusals_reach_the_submitter_and_the_log_with_the_peer(make_svc, caplog):
    svc = make_svc()
    peer = "12D3KooWFloodingPeerForThisTest"
    with caplog.at_level(logging.DEBUG, logger="tally.ledger"):
        # the tx topic's gossip validator: False = neither delivered nor relayed to other peers
        verdicts = [svc._validate_tx_gossip(pack(pay(NOBODY, 0).to_wire()), peer),
                    svc._validate_tx_gossip(pack(pay(CLIENT, 500).to_wire()), peer),
                    svc._validate_tx_gossip(b"\xc1not msgpack", peer),
                    svc._validate_tx_gossip(pack(pay(A, 0).to_wire()), peer)]  # a good one is admitted
    assert verdicts == [False, False, False, True]
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "refused" in r.getMessage()]
    assert len(msgs) == 3 and all(peer in m for m in msgs)
    assert "insufficient balance" in msgs[0] and "too far ahead" in msgs[1]
    assert len(svc.mempool) == 1 and len(svc.mempool._refusals[peer]) == 3
    with pytest.raises(InvalidTx, match="insufficient balance"):  # a local caller gets the reason raised
        svc.add_tx(pay(NOBODY, 0, amount=2))


def test_per_peer_caps_on_refusals_and_on_queued(make_svc):
    now = [1000.0]
    svc = make_svc(max_refusals_per_peer=5, peer_window_s=10.0, max_queued_per_peer=2)
    svc.mempool.clock = lambda: now[0]
    p, q = "12D3KooWPeerP", "12D3KooWPeerQ"
    for n in range(5):
        with pytest.raises(InvalidTx, match="insufficient"):
            svc.add_tx(pay(NOBODY, n), peer=p)
    good = pay(A, 0)
    with pytest.raises(InvalidTx, match="refused transactions in the last 10 s"):
        svc.add_tx(good, peer=p)  # over its budget: even a good one waits
    svc.add_tx(pay(B, 0), peer=q)  # others are heard
    now[0] += 11
    svc.add_tx(good, peer=p)  # the window slid past its refusals
    svc.add_tx(pay(A, 1), peer=p)
    with pytest.raises(InvalidTx, match="peer has 2 transactions queued"):
        svc.add_tx(pay(A, 2), peer=p)
    svc.add_tx(pay(A, 2))  # a local caller is not a peer
    svc.add_tx(good, peer=p)  # already queued: a no-op, not a refusal
    assert len(svc.mempool) == 4


def test_a_new_head_drops_what_no_longer_applies_with_reasons(make_svc):
    svc = make_svc()
    mine = [pay(A, 0, 60 * C), pay(A, 1, 30 * C)]
    for t in mine:
        svc.add_tx(t)
    other = pay(A, 0, 90 * C, to=W2)  # the same nonce spent elsewhere (a block from another proposer)
    st = svc.state
    block, new_state, rejected = propose(st, [other], VALIDATOR, 10**6, svc.store.last_commit())
    assert not rejected

    async def main():
        assert await svc.commit_decided(block, commit_block(VALIDATOR, block), new_state)

    trio.run(main)
    assert len(svc.mempool) == 0
    assert "already used" in svc.rejected[mine[0].id] or "bad nonce" in svc.rejected[mine[0].id]
    assert "insufficient balance" in svc.rejected[mine[1].id]
    assert svc.next_nonce(A.account) == 1


def test_mempool_alone_on_a_stored_state(tmp_path):
    """The pure class with a store's replayed state: mapping view, pending nonce, reset after a block."""
    g = genesis()
    store = LedgerStore(tmp_path / "db", g)
    try:
        pool = Mempool(store.replay(), Limits(nonce_window=4))
        t0, t1 = pay(A, 0), pay(A, 1)
        assert pool.add(t1) == t1.id and pool.add(t0) == t0.id
        assert set(pool) == {t0.id, t1.id} and pool[t0.id] == t0 and pool.next_nonce(A.account) == 2
        block, new_state, _ = propose(pool.state, pool.candidates(), VALIDATOR, 10**6, (), verified=pool.verified)
        pool.reset(new_state, [t.id for t in block.txs])
        assert len(pool) == 0 and pool.size_bytes == 0 and pool.next_nonce(A.account) == 2
        with pytest.raises(InvalidTx, match="too far ahead"):
            pool.add(pay(A, 6))
    finally:
        store.close()



# --- issue 24 finding 6, played as an attacker: fee-free toggles are account business, capped per account ---


def _run_post(g, nonce: int):
    f = dict(title="t", model_id=b"m" * 32, dataset_root=b"d" * 32, trainable="lora", rank=4,
             targets="q_proj,v_proj", seed=1, params0=b"\x01" * 32, lr_micro=1000, batch_size=2, seq_len=16,
             inner_steps=5, inner_state="reset", screen_windows=1, rounds=2, min_workers=3, max_workers=4,
             outer_lr_ppm=700_000, outer_momentum_ppm=0, nesterov=1, clip_ppm=2_000_000, codec="int8",
             topk_ppm=0, price_per_step=10_000_000, aggregator_fee=20_000_000, sample_ppm=0,
             round_timeout=5, deadline=500)
    return RunPost(g.domain, CLIENT.account, b"r" * 16, nonce=nonce, **f).signed(CLIENT)


def test_run_join_leave_toggles_cannot_evict_transfers(tmp_path):
    """Four bonded accounts each try 64 join/leave toggles (fee-free) against a small pool holding honest
    transfers: toggles are ACCOUNT class (they never evict a ready transfer) and at most ``max_free_per_sender``
    of them per account are queued; every honest transfer lands, and credits are conserved in the reopened
    LevelDB."""
    g = genesis()
    store = LedgerStore(tmp_path / "db", g)
    svc = LedgerService(store, g, VALIDATOR, host=None, mempool_limits=Limits(max_txs=48, account_share_pct=50))
    post = _run_post(g, 0)
    attackers = [W1, W2, W3, W4]

    def toggle(w, n):
        cls = RunJoin if n % 2 == 0 else RunLeave
        return cls(g.domain, w.account, post.run_id, n).signed(w)

    async def main():
        svc.add_tx(post)
        await produce(svc)
        assert post.run_id in runs_of(svc.state)
        honest = [pay(A, 0), pay(B, 0), pay(D, 0), pay(A, 1), pay(B, 1)]
        for t in honest:
            svc.add_tx(t)
        queued = refusals = 0
        for w in attackers:
            for n in range(64):
                try:
                    svc.add_tx(toggle(w, n))
                    queued += 1
                except InvalidTx as e:
                    refusals += 1
                    assert "move no credits" in str(e) or "mempool full for account" in str(e), str(e)
        assert priority(toggle(W1, 0)) is Priority.ACCOUNT and priority(toggle(W1, 1)) is Priority.ACCOUNT
        assert queued <= 4 * Limits().max_free_per_sender and refusals == 4 * 64 - queued
        assert all(t.id in svc.mempool for t in honest)  # no transfer was evicted
        assert svc.mempool.stats["evicted"] == 0
        block = await produce(svc)
        assert set(honest) <= set(block.txs)  # and every one lands
        return queued

    try:
        queued = trio.run(main)
        assert queued == 4 * Limits().max_free_per_sender  # the cap, not the pool, stopped them (24 - 5 slots free)
        assert svc.state.account(A.account).nonce == 2 and svc.state.account(B.account).nonce == 2
    finally:
        store.close()
    store = LedgerStore(tmp_path / "db", g)  # reopened: supply conserved on disk
    try:
        assert store.replay().supply() == g.supply
    finally:
        store.close()


def test_cost_counts_every_escrow(make_svc):
    """A gapped batch post is paid for with the sender's other queued transactions (its escrow was counted as 0:
    a sender could queue posts it could never pay, holding slots until they expire)."""
    svc = make_svc()
    g = svc.genesis
    post = BatchPost(g.domain, A.account, b"b" * 16, b"\x01" * 32, 10, "score", 0, 3, 2, C, 1, 20, 20, 2)
    assert cost(post) == post.escrow() == 60 * C
    assert cost(make_receipt(g, W1)) == make_receipt(g, W1).price
    svc.add_tx(pay(A, 1, 50 * C))  # gapped: waits for nonce 0
    why = refused(svc, post.signed(A), "insufficient balance")
    assert f"{110 * C} base units needed" in why
    assert is_free(Unbond(g.domain, A.account, C, 0)) and not is_free(post)


def test_a_validator_does_not_verify_again_what_its_mempool_admitted(make_svc, monkeypatch):
    """A proposal (check_block) and a committed block from a peer (apply_remote) skip the signatures of the exact
    objects this node's mempool admitted, and verify every other one: a transaction it never saw, and one whose id
    it admitted but with other signature bytes."""
    calls = []
    real = node.keys.verify

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(node.keys, "verify", counting)
    monkeypatch.setattr(node.ledger.core.txbase, "verify", counting)
    monkeypatch.setattr(node.ledger.core.block, "verify", counting)  # a commit's precommit signatures
    proposer, checker = make_svc(), make_svc()
    g = proposer.genesis
    seen, unseen = [pay(A, 0), make_receipt(g, W1)], pay(B, 0)
    for t in seen + [unseen]:
        proposer.add_tx(t)
    for t in seen:
        checker.add_tx(t)
    blocks = []

    async def build():
        blocks.append(await produce(proposer))

    trio.run(build)
    block = blocks[0]
    assert set(block.txs) == {*seen, unseen}
    s0 = checker.state
    del calls[:]
    cached = check_block(s0, block, checker.mempool.verified)
    assert len(calls) == 1  # only the transfer it never saw: one signature
    del calls[:]
    full = check_block(s0, block)
    assert len(calls) == 1 + 1 + 2  # every signature of the block
    assert cached.state_root() == full.state_root() == proposer.state.state_root()

    # the same id with other signature bytes is verified, and refused, though its id was admitted
    forged = replace(seen[0], sig=bytes(64))
    header = Header(s0.chain_id, s0.height + 1, s0.last_hash, 10**6, VALIDATOR.account, tx_root([forged]),
                    s0.state_root())
    bad = Block(header, (forged,), checker.store.last_commit())
    with pytest.raises(InvalidBlock, match="bad transfer signature"):
        check_block(s0, bad, checker.mempool.verified)

    # the committed block through the service's path for blocks from peers: stored, with one signature verified
    del calls[:]

    async def remote():
        assert await checker.apply_remote({"b": block.to_wire(), "c": list(commit_block(VALIDATOR, block))})

    trio.run(remote)
    assert len(calls) == 1 + 1  # the unseen transfer and the commit's one precommit signature
    assert checker.state.height == 1 and checker.state.state_root() == proposer.state.state_root()
