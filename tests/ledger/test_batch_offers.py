"""Batch work is opted into and priced (issue 24 finding 2, check 4) and audit committees are paid (finding 8), on
the real state transition; check 4 and the audit pay through a real LevelDB store in a tmp dir, reopened.

Played as an attacker with funded accounts would: a dust-priced batch of 10,000 items, a batch priced for workers
that never offered, a requester flooding the network with open items. Nothing honest is drawn against its will,
nothing honest is penalised, and credits are conserved in the reopened store.
"""

from __future__ import annotations

import os

import pytest

from node.identity import Identity, dev_seed
from node.ledger.core import batch as bm, batchrules as br
from node.ledger.core.batchstate import AuditStatus, BatchStatus, ItemStatus, WorkerRecord, item_key, open_batches
from node.ledger.core.batchtx import (
    WITHDRAWN,
    BatchAuditVote,
    BatchCommit,
    BatchOffer,
    BatchPost,
    BatchReveal,
    commitment,
    escrow_of,
    items_root,
)
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.genesis import Genesis, GenesisError, Params
from node.ledger.core.state import apply_tx, genesis_state
from node.ledger.core.tx import InvalidTx, decode_tx
from node.ledger.store import LedgerStore

C = 10**9
KEYS = [Identity.from_seed(dev_seed(i)) for i in range(8)]
REQ, WORKERS = KEYS[0], KEYS[1:8]  # seven bonded workers
BY = {k.account: k for k in KEYS}
FLOOR = 1_000  # the genesis floor in these tests: base units per token
TOKENS = 16  # tokens of work per generate item (max_tokens)


def genesis(**params) -> Genesis:
    p = Params(**{"block_time_ms": 100, "price_per_token_block": 1000, "max_receipt_price": C,
                  "slash_amount": 100 * C, "batch_min_token_price": FLOOR, **params})
    p.check()
    bal = [(REQ.account, 10**6 * C, 0)] + [(k.account, 100 * C, 200 * C) for k in WORKERS]
    return Genesis("offer-chain", 0, (REQ.account,), tuple(bal), p)


G = genesis()


def offer(s, w: Identity, floor: int, g: Genesis = G) -> BatchOffer:
    return BatchOffer(s.chain_id, w.account, floor, s.account(w.account).nonce).signed(w)


def post(s, n: int, price: int, g: Genesis = G, k: int = 3, q: int = 2, reissues: int = 0, cw: int = 3,
         rw: int = 3) -> BatchPost:
    root = items_root([b'{"prompt": "%d"}' % i for i in range(n)])
    return BatchPost(s.chain_id, REQ.account, os.urandom(16), root, n, "generate", TOKENS, k, q, price, reissues, cw,
                     rw, s.account(REQ.account).nonce).signed(REQ)


def refused(s, tx, match: str) -> None:
    """``tx`` is refused with ``match`` and the state is unchanged (same root)."""
    root = s.state_root()
    w = s.copy()
    with pytest.raises(InvalidTx, match=match):
        apply_tx(w, tx)
    assert w.state_root() == root


class Chain:
    """A real LevelDB ledger in a tmp dir, blocks proposed and appended as a validator would."""

    def __init__(self, path, g: Genesis = G):
        self.path, self.g = path, g
        self.store = LedgerStore(path, g)
        self.state = self.store.replay()

    def block(self, *txs) -> None:
        block, new, rejected = propose(self.state, list(txs), REQ, 1000 + self.state.height,
                                       self.store.last_commit())
        assert not rejected, rejected
        self.store.append(block, commit_block(REQ, block), self.state, new)
        self.state = new
        assert new.supply() == self.g.supply

    def reopen(self):
        root = self.state.state_root()
        self.store.close()
        self.store = LedgerStore(self.path, self.g)
        self.state = self.store.replay()
        assert self.state.state_root() == root and self.state.supply() == self.g.supply
        return self.state

    def close(self) -> None:
        self.store.close()


def test_offer_opts_in_replaces_and_withdraws_and_round_trips_on_the_wire():
    s = genesis_state(G)
    w = WORKERS[0]
    assert bm.reputation(s, w.account).offer == -1  # nobody is opted in at genesis
    tx = offer(s, w, 5 * FLOOR)
    assert decode_tx(tx.to_wire()) == tx and tx.KIND == "batch_offer"
    s1 = s.copy()
    apply_tx(s1, tx)
    assert bm.reputation(s1, w.account).offer == 5 * FLOOR and s1.account(w.account).nonce == 1
    apply_tx(s1, offer(s1, w, FLOOR))  # a later offer replaces it
    assert bm.reputation(s1, w.account).offer == FLOOR
    apply_tx(s1, offer(s1, w, WITHDRAWN))
    assert bm.reputation(s1, w.account) == WorkerRecord()  # withdrawn, nothing else held: the record is gone
    refused(s1, offer(s1, w, 10**16), "min_price_per_token must be -1")
    # nothing for free: a withdrawal needs a live offer, an offer a bond (else any key could write state)
    refused(s1, offer(s1, w, WITHDRAWN), "no batch offer to withdraw")
    refused(s1, offer(s1, REQ, 0), "only a bonded account")
    with pytest.raises(InvalidTx, match="bad value"):  # below -1 never decodes
        decode_tx({**tx.to_wire(), "f": [w.account, -2, 0]})


def test_check4_a_10000_item_batch_below_the_floor_is_refused_and_one_at_the_floor_goes_only_to_opted_in_workers(
        tmp_path):
    """Check 4 on a real LevelDB ledger: four workers offer at the floor, one only at twice the floor, two never
    offer. A 10,000-item post one base unit per token below the genesis floor is refused and changes nothing; at the
    floor it is drawn only among the four, the other three are never drawn (nor penalised), and the reopened store
    has the same state and the same supply."""
    ch = Chain(tmp_path / "db")
    at_floor, dear, never = WORKERS[:4], WORKERS[4], WORKERS[5:]
    ch.block(*[offer(ch.state, w, FLOOR) for w in at_floor], offer(ch.state, dear, 2 * FLOOR))
    s = ch.state
    cheap = post(s, 10_000, (FLOOR - 1) * TOKENS)
    refused(s, cheap, r"below the chain's floor of 1000 base units per token × 16 tokens per item = 16000")
    _, after, rejected = propose(s, [cheap], REQ, 5000, ch.store.last_commit())
    assert len(rejected) == 1 and after.state_root() == s.state_root() and not open_batches(after)  # nothing moved
    p = post(s, 10_000, FLOOR * TOKENS)
    ch.block(p)
    for _ in range(4):
        ch.block()
    st = ch.reopen()
    b = st.tables["batches"][p.batch_id]
    assert b.status == BatchStatus.RUNNING and b.assigned == 4 * bm.MAX_ASSIGN_PER_BLOCK
    drawn = set()
    for i in range(b.assigned):
        it = st.tables["batch_items"][item_key(p.batch_id, i)]
        assert len(it.workers) == 3
        drawn |= set(it.workers)
    assert drawn == {w.account for w in at_floor}  # every taker drawn, nobody else
    for w in (dear, *never):
        assert bm.held(st, w.account) == 0 and st.account(w.account).bond == 200 * C
    assert st.account(REQ.account).escrow == p.escrow() == 10_000 * 3 * FLOOR * TOKENS
    ch.close()


def test_a_post_nobody_takes_at_its_price_and_a_flood_of_open_items_are_refused():
    g = genesis(batch_max_open_items=15_000)
    s = genesis_state(g)
    s.tables["batch_workers"][WORKERS[0].account] = WorkerRecord(offer=FLOOR)  # as offers in an earlier block
    s.tables["batch_workers"][WORKERS[1].account] = WorkerRecord(offer=FLOOR)
    s.tables["batch_workers"][WORKERS[2].account] = WorkerRecord(offer=3 * FLOOR)
    refused(s, post(s, 10, FLOOR * TOKENS, g), r"only 2 bonded account\(s\) .* accept batches at 16000 base units "
                                               r"per item \(1000 per token\); replication k = 3 needs 3")
    s1 = s.copy()
    p = post(s1, 10_000, 3 * FLOOR * TOKENS, g)
    apply_tx(s1, p)  # at three times the floor the third worker takes it too
    assert bm.reputation(s1, REQ.account).open_items == 10_000
    refused(s1, post(s1, 5_001, 3 * FLOOR * TOKENS, g), "hold 10000 items; 5001 more would exceed .* cap of 15000")
    apply_tx(s1, post(s1, 5_000, 3 * FLOOR * TOKENS, g))  # exactly the cap
    assert bm.reputation(s1, REQ.account).open_items == 15_000
    # an unbonded account's offer does not count
    s2 = s.copy()
    s2.tables["batch_workers"][KEYS[0].account] = WorkerRecord(offer=0)  # the requester itself
    refused(s2, post(s2, 10, FLOOR * TOKENS, g), "only 2 bonded")


def test_the_open_item_count_falls_when_a_batch_is_cancelled_or_settles():
    g = genesis(batch_max_open_items=20)
    s = genesis_state(g)
    _, s, rej = propose(s, [offer(s, w, 0, g) for w in WORKERS[:3]], REQ, 0, ())
    p = post(s, 20, FLOOR * TOKENS, g)
    _, s, rej = propose(s, [p], REQ, 0, ())
    assert not rej and bm.reputation(s, REQ.account).open_items == 20
    refused(s, post(s, 1, FLOOR * TOKENS, g), "cap of 20")
    from node.ledger.core.batchtx import BatchCancel

    _, s, rej = propose(s, [BatchCancel(s.chain_id, REQ.account, p.batch_id, 1).signed(REQ)], REQ, 0, ())
    assert not rej and bm.reputation(s, REQ.account).open_items == 0
    apply_tx(s.copy(), post(s, 20, FLOOR * TOKENS, g))  # room again


def _play(ch: Chain, bid: bytes, result: bytes, skip: set[bytes] = frozenset(), vote=None, limit: int = 100):
    """Drive the batch to settlement: every drawn worker but ``skip`` commits and reveals ``result``; every audit
    member votes ``vote(item, member)`` (None: no vote)."""
    salt = b"s" * 32
    for _ in range(limit):
        st = ch.state
        b = st.tables["batches"][bid]
        if b.status == BatchStatus.SETTLED:
            return b
        txs = []
        for i in range(b.assigned):
            it = st.tables["batch_items"][item_key(bid, i)]
            if it.status == ItemStatus.ASSIGNED:
                for w in it.workers:
                    if w in skip:
                        continue
                    if it.commitment_of(w) is None:
                        c = commitment(bid, i, it.attempt, w, result, salt)
                        txs.append(BatchCommit(st.chain_id, w, bid, i, it.attempt, c).signed(BY[w]))
                    elif all(x != w for x, _ in it.reveals) and len(it.commits) == len(it.workers):
                        txs.append(BatchReveal(st.chain_id, w, bid, i, it.attempt, result, salt).signed(BY[w]))
            elif it.audit == AuditStatus.OPEN and vote is not None:
                for m in it.audit_committee:
                    r = vote(it, m)
                    if r is not None and all(x != m for x, _ in it.audit_votes):
                        txs.append(BatchAuditVote(st.chain_id, m, bid, i, r).signed(BY[m]))
        ch.block(*txs)
    raise AssertionError("the batch did not settle")


def test_a_withdrawn_offer_stops_new_draws_and_its_held_items_are_still_finished(tmp_path):
    g = genesis(batch_max_held=1)  # items are drawn as workers finish others
    ch = Chain(tmp_path / "db", g)
    ch.block(*[offer(ch.state, w, 0, g) for w in WORKERS[:4]])
    p = post(ch.state, 8, FLOOR * TOKENS, g)
    ch.block(p)
    ch.block()
    leaver = next(w for w in WORKERS[:4] if bm.held(ch.state, w.account))
    ch.block(offer(ch.state, leaver, WITHDRAWN, g))
    held_at_leave = {i for i in range(ch.state.tables["batches"][p.batch_id].assigned)
                     if leaver.account in ch.state.tables["batch_items"][item_key(p.batch_id, i)].workers}
    b = _play(ch, p.batch_id, b"R" * 32)
    st = ch.reopen()
    assert b.accepted == 8
    mine = {i for i in range(8) if leaver.account in st.tables["batch_items"][item_key(p.batch_id, i)].workers}
    assert mine == held_at_leave and mine  # finished what it held, drawn for nothing after it left
    assert st.account(leaver.account).bond == 200 * C  # and was not penalised
    assert st.account(REQ.account).escrow == 0
    ch.close()


@pytest.mark.parametrize("outcome", ["upheld", "undecided"])
def test_audit_members_that_vote_the_outcome_are_paid_from_the_fee_escrowed_at_the_post(tmp_path, outcome):
    """Finding 8: with every item audited (batch_audit_ppm 10^6) and batch_audit_pay_bps 5000, a post escrows
    committee_size × price / 2 per item besides its replicas'; each member that voted the audit's outcome is paid
    price / 2, a member that did not vote is paid nothing, and an undecided audit pays nobody; the rest returns to
    the requester. Credits are conserved in the reopened store."""
    g = genesis(batch_audit_ppm=1_000_000, batch_audit_pay_bps=5_000, committee_size=2, verdict_timeout=5)
    ch = Chain(tmp_path / "db", g)
    ch.block(*[offer(ch.state, w, 0, g) for w in WORKERS])
    price = FLOOR * TOKENS
    p = post(ch.state, 3, price, g)
    before = ch.state.account(REQ.account).balance
    ch.block(p)
    esc = p.escrow() + 3 * 2 * price // 2
    assert escrow_of(g.params, p) == esc and ch.state.account(REQ.account).escrow == esc

    def vote(it, m):  # upheld: every member votes the result; undecided: only the committee's first member votes
        # (one vote of two is no 2/3 quorum), the other stays silent
        return b"R" * 32 if outcome == "upheld" or m == it.audit_committee[0] else None

    b = _play(ch, p.batch_id, b"R" * 32, vote=vote)
    st = ch.reopen()
    items = [st.tables["batch_items"][item_key(p.batch_id, i)] for i in range(3)]
    assert all(it.audit_committee for it in items)
    paid_members = {}
    for it in items:
        want = AuditStatus.UPHELD if outcome == "upheld" else AuditStatus.UNDECIDED
        assert it.audit == want
        if outcome == "upheld":
            for m in it.audit_committee:
                paid_members[m] = paid_members.get(m, 0) + price // 2
    replicas = sum(price * len(it.agreed) for it in items)
    assert b.paid == replicas + sum(paid_members.values())
    assert b.paid + b.refunded == esc and b.escrow_left == 0
    assert st.account(REQ.account).balance == before - b.paid and st.account(REQ.account).escrow == 0
    for w in WORKERS:  # each got its replicas' price and its audit pay, nothing else; nobody honest lost bond
        replica = sum(price for it in items if w.account in it.agreed)
        assert st.account(w.account).balance == 100 * C + replica + paid_members.get(w.account, 0)
        assert st.account(w.account).bond == 200 * C
    ch.close()


def test_new_params_are_optional_in_the_genesis_hash_and_checked():
    base = Genesis("x", 0, (REQ.account,), ((REQ.account, C, 0),), Params())
    same = Genesis("x", 0, (REQ.account,), ((REQ.account, C, 0),),
                   Params(batch_min_token_price=0, batch_max_open_items=0, batch_audit_pay_bps=0))
    assert base.hash == same.hash
    for name in ("batch_min_token_price", "batch_max_open_items", "batch_audit_pay_bps"):
        other = Genesis("x", 0, (REQ.account,), ((REQ.account, C, 0),), Params(**{name: 7}))
        assert other.hash != base.hash and name in other.to_doc()["params"]
    with pytest.raises(GenesisError, match="batch_audit_pay_bps"):
        Params(batch_audit_pay_bps=100_001).check()
    with pytest.raises(GenesisError, match="batch_min_token_price"):
        Params(batch_min_token_price=10**16).check()
    assert Params().batch_token_floor() == 1 and br.max_open_items(Params()) == 100_000


def test_mempool_cost_counts_the_audit_fee_escrow():
    from node.ledger.mempool_policy import cost

    g = genesis(batch_audit_ppm=1_000, batch_audit_pay_bps=10_000, committee_size=2)
    p = post(genesis_state(g), 10, FLOOR * TOKENS, g)
    assert cost(p, g.params) == escrow_of(g.params, p) == p.escrow() + 10 * 2 * FLOOR * TOKENS
    assert cost(p) == p.escrow()  # without the chain's parameters: the replicas' escrow only


def test_an_overturning_audit_pays_the_members_that_found_the_result_and_nobody_honest_loses(tmp_path):
    """Finding 8 with a colluding pair (workers 0 and 1 always reveal and vote X; the others R): five workers offer,
    k = 3, so each item's committee is the two workers not drawn for it. An item the pair won is overturned by its
    honest committee, and both members are paid; an honest item audited by the pair is undecided and pays nobody;
    one audited by one colluder and one honest member is undecided too. Honest workers end with their whole bond,
    every balance is the genesis one plus its replica pay and audit pay, and supply is conserved in the reopened
    store."""
    g = genesis(batch_audit_ppm=1_000_000, batch_audit_pay_bps=10_000, committee_size=2, verdict_timeout=4,
                batch_slash=10 * C)
    ch = Chain(tmp_path / "db", g)
    five = WORKERS[:5]
    pair = {five[0].account, five[1].account}
    ch.block(*[offer(ch.state, w, 0, g) for w in five])
    price = FLOOR * TOKENS
    p = post(ch.state, 30, price, g)
    p = BatchPost(p.chain_id, p.sender, b"\x07" * 16, *p.unsigned()[2:]).signed(REQ)  # a fixed id: a fixed draw
    ch.block(p)
    salt, R, X = b"s" * 32, b"R" * 32, b"X" * 32

    def res(w):
        return X if w in pair else R

    for _ in range(100):
        st = ch.state
        b = st.tables["batches"][p.batch_id]
        if b.status == BatchStatus.SETTLED:
            break
        txs = []
        for i in range(b.assigned):
            it = st.tables["batch_items"][item_key(p.batch_id, i)]
            if it.status == ItemStatus.ASSIGNED:
                for w in it.workers:
                    if it.commitment_of(w) is None:
                        c = commitment(p.batch_id, i, it.attempt, w, res(w), salt)
                        txs.append(BatchCommit(st.chain_id, w, p.batch_id, i, it.attempt, c).signed(BY[w]))
                    elif all(x != w for x, _ in it.reveals) and len(it.commits) == len(it.workers):
                        txs.append(BatchReveal(st.chain_id, w, p.batch_id, i, it.attempt, res(w), salt)
                                   .signed(BY[w]))
            elif it.audit == AuditStatus.OPEN:
                txs += [BatchAuditVote(st.chain_id, m, p.batch_id, i, res(m)).signed(BY[m])
                        for m in it.audit_committee if all(x != m for x, _ in it.audit_votes)]
        ch.block(*txs)
    st = ch.reopen()
    b = st.tables["batches"][p.batch_id]
    items = [st.tables["batch_items"][item_key(p.batch_id, i)] for i in range(30)]
    assert b.status == BatchStatus.SETTLED and b.escrow_left == 0 and b.paid + b.refunded == escrow_of(g.params, p)
    won = [it for it in items if pair <= set(it.workers)]
    assert won and b.overturned == len(won)
    expect = {w.account: 100 * C for w in five}
    for it in items:
        for _a, w, f, x in it.history:
            if f.value == "agreed":
                expect[w] += x  # the price of each agreeing replica (an overruled one keeps it)
        if it in won:
            assert it.audit == AuditStatus.OVERTURNED and it.result == R
        else:
            assert it.audit == (AuditStatus.UPHELD if not pair & set(it.audit_committee) else
                                AuditStatus.UNDECIDED)
        if it.audit in (AuditStatus.UPHELD, AuditStatus.OVERTURNED):
            for m in it.audit_committee:  # both voted R: paid the item's price each
                expect[m] += price
    for w in five:
        assert st.account(w.account).balance == expect[w.account], w.account in pair
        if w.account not in pair:
            assert st.account(w.account).bond == 200 * C  # vindicated dissents came back
    assert st.account(REQ.account).escrow == 0
    ch.close()
