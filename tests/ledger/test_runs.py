"""The training run state machine (node.ledger.core.runs) driven block by block on the pure ledger state."""

from __future__ import annotations

import os

import pytest

from node.encoding import H
from node.ledger.core.runs import Phase, RunStatus
from node.ledger.core.runstate import runs_of
from node.ledger.core.runtx import (
    NO_MOMENTUM,
    RoundAggregate,
    RoundReceipt,
    RoundReveal,
    RunCancel,
    RunJoin,
    RunLeave,
    RunPost,
)
from node.ledger.core.state import INVALID_S, SAMPLED, apply_block_body, apply_tx, genesis_state
from node.ledger.core.status import FINAL, VALID_S
from node.ledger.core.tx import INVALID, VALID, InvalidTx, Vote, decode_tx
from node.ledger.genesis import TREASURY
from node.training.api import run_view
from node.web.views import acct

from .helpers import KEYS, C, make_genesis

SPONSOR = KEYS[0]
WORKERS = [KEYS[1], KEYS[2], KEYS[3], KEYS[4]]
BY_ACCOUNT = {k.account: k for k in KEYS}


class Chain:
    """A ledger advanced block by block (block hash: H(height)), checking the supply after every block."""

    def __init__(self, **params):
        self.g = make_genesis(sample_base_ppm=20_000, sample_floor_ppm=20_000, **params)
        self.s = genesis_state(self.g)
        self.supply = self.s.supply()
        self.nonces: dict[bytes, int] = {}

    def nonce(self, ident) -> int:
        n = self.nonces.get(ident.account, 0)
        self.nonces[ident.account] = n + 1
        return n

    def block(self, *txs):
        h = self.s.height + 1
        self.s = apply_block_body(self.s, h, H(h.to_bytes(8, "big")), list(txs))
        assert self.s.supply() == self.supply, "credits must be conserved"
        return self.s

    def refuse(self, tx, match: str):
        with pytest.raises(InvalidTx, match=match):
            apply_tx(self.s.copy(), tx)

    def post(self, advance: bool = True, **kw) -> RunPost:
        f = dict(title="t", model_id=b"m" * 32, dataset_root=b"d" * 32, trainable="lora", rank=4,
                 targets="q_proj,v_proj", seed=1, params0=b"\x01" * 32, lr_micro=1000, batch_size=2, seq_len=16,
                 inner_steps=5, inner_state="reset", screen_windows=1, rounds=2, min_workers=3, max_workers=4,
                 outer_lr_ppm=700_000, outer_momentum_ppm=0, nesterov=1, clip_ppm=2_000_000, codec="int8",
                 topk_ppm=0, price_per_step=10_000_000, aggregator_fee=20_000_000, sample_ppm=0,
                 round_timeout=5, deadline=500)
        f.update(kw)
        nonce = self.nonce(SPONSOR) if advance else self.nonces.get(SPONSOR.account, 0)
        return RunPost(self.g.domain, SPONSOR.account, os.urandom(16), nonce=nonce, **f).signed(SPONSOR)

    def run(self, post):
        return runs_of(self.s)[post.run_id]

    def receipt(self, post, w, *, params_before=None, delta=None, **kw) -> RoundReceipt:
        run = self.run(post)
        cur = run.cur
        f = dict(opt_before=H(b"ob", w.account), params_after=H(b"pa", w.account, bytes([cur.round])),
                 opt_after=H(b"oa", w.account, bytes([cur.round])), batches_root=H(b"b", w.account),
                 delta_root=delta or H(b"delta", w.account, bytes([cur.round])), delta_bytes=1000,
                 loss_ppm=4_000_000, steps=post.inner_steps, price=post.receipt_price)
        f.update(kw)
        return RoundReceipt(self.g.domain, post.run_id, cur.round, cur.attempt, w.account, SPONSOR.account,
                            params_before or run.params, **f).signed(w)

    def reveal(self, post, w) -> RoundReveal:
        cur = self.run(post).cur
        r = self.s.receipts[cur.receipt_of(w.account)].receipt
        return RoundReveal(self.g.domain, post.run_id, cur.round, cur.attempt, w.account, r.delta_root).signed(w)

    def aggregate(self, post, accepted, who=None, params_next=None) -> RoundAggregate:
        run = self.run(post)
        cur = run.cur
        agg = who or BY_ACCOUNT[cur.aggregator]
        return RoundAggregate(self.g.domain, post.run_id, cur.round, cur.attempt, agg.account, SPONSOR.account,
                              run.params, run.momentum, params_next or H(b"theta", run.params),
                              H(b"mom", run.params), tuple(sorted(accepted)), post.aggregator_fee).signed(agg)

    def votes(self, rid, verdict):
        rec = self.s.receipts[rid]
        return [Vote(self.g.domain, rid, m, rec.round, verdict, 0).signed(BY_ACCOUNT[m]) for m in rec.committee]

    def settle_round(self, post, accepted=None, verdicts=None):
        """Drive the open round from commit to the next round (all workers honest unless ``verdicts`` says)."""
        cur = self.run(post).cur
        self.block(*[self.receipt(post, BY_ACCOUNT[w]) for w in cur.participants])
        assert self.run(post).cur.phase == Phase.REVEAL
        self.block(*[self.reveal(post, BY_ACCOUNT[w]) for w in cur.participants])
        cur = self.run(post).cur
        assert cur.phase == Phase.AGGREGATE and cur.aggregator in cur.participants
        votes = []
        for w, rid, _ in cur.commits:
            if self.s.receipts[rid].status == SAMPLED:
                votes += self.votes(rid, (verdicts or {}).get(w, VALID))
        if votes:
            self.block(*votes)
        acc = [w for w in cur.participants if self.s.receipts[cur.receipt_of(w)].status != INVALID_S] \
            if accepted is None else accepted
        a = self.aggregate(post, acc)
        self.block(a)
        assert self.run(post).cur.phase == Phase.CHECK
        self.block()  # the aggregate is sampled (always) at the next block
        assert self.s.receipts[a.id].status == SAMPLED
        self.block(*self.votes(a.id, VALID))
        return a


def start(chain: Chain, **kw) -> RunPost:
    post = chain.post(**kw)
    chain.block(post)
    chain.block(*[RunJoin(chain.g.domain, w.account, post.run_id, chain.nonce(w)).signed(w) for w in WORKERS])
    assert chain.run(post).status == RunStatus.TRAINING and chain.run(post).cur.phase == Phase.COMMIT
    return post


def test_honest_run_pays_every_contribution_once_and_returns_the_rest():
    c = Chain()
    bal0 = {k.account: c.s.account(k.account).balance for k in KEYS[:5]}
    post = start(c)
    assert c.s.account(SPONSOR.account).escrow == post.budget
    for r in range(post.rounds):
        before = c.run(post).params
        a = c.settle_round(post)
        run = c.run(post)
        assert run.round == r + 1 and run.params == a.params_next != before
        assert run.history[-1].accepted == tuple(sorted(w.account for w in WORKERS))
    for _ in range(8):  # unsampled receipts settle after the challenge window, then the run ends
        c.block()
    run = c.run(post)
    assert run.status == RunStatus.FINISHED and run.escrow_left == 0
    assert c.s.account(SPONSOR.account).escrow == 0
    fee = post.receipt_price * c.g.params.committee_fee_bps // 10_000
    paid = sum(c.s.account(w.account).balance - bal0[w.account] for w in WORKERS)
    # every worker's contribution was paid exactly once per round (less a committee fee when it was sampled),
    # aggregators and committees were paid from the same escrow; the sponsor got back exactly the rest
    assert run.paid_workers + run.paid_aggregators <= post.budget
    assert post.rounds * 4 * (post.receipt_price - fee) <= run.paid_workers <= post.rounds * 4 * post.receipt_price
    spent = bal0[SPONSOR.account] - c.s.account(SPONSOR.account).balance
    assert spent == post.budget - run.refunded
    assert paid >= run.paid_workers  # workers also earned committee fees on the aggregates
    assert c.s.account(TREASURY).balance == 0


def test_commit_reveal_order_and_refusals():
    c = Chain()
    post = start(c)
    w1, w2 = WORKERS[0], WORKERS[1]
    r1 = c.receipt(post, w1)
    c.block(r1)
    c.refuse(c.receipt(post, w1), "already committed")
    c.refuse(c.receipt(post, w2, params_before=b"\x09" * 32), "params_before")
    c.refuse(c.receipt(post, w2, steps=post.inner_steps - 1), "steps")
    c.refuse(c.receipt(post, w2, price=post.receipt_price + 1), "price")
    # a reveal before the commit phase closed is refused: nobody can copy a Δ in time
    cur = c.run(post).cur
    c.refuse(RoundReveal(c.g.domain, post.run_id, 0, 0, w1.account, r1.delta_root).signed(w1), "reveal phase")
    outsider = KEYS[5]
    c.refuse(RoundReceipt(c.g.domain, post.run_id, 0, 0, outsider.account, SPONSOR.account, cur and c.run(post).params,
                          *[b"\x02" * 32] * 6, 1, 0, post.inner_steps, post.receipt_price).signed(outsider),
             "not a participant")


def test_aggregate_waits_for_verdicts_and_excludes_an_invalid_worker():
    c = Chain()
    post = start(c, sample_ppm=1_000_000)  # every round receipt replayed
    cheat = WORKERS[2]
    cur = c.run(post).cur
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in cur.participants])
    c.block(*[c.reveal(post, BY_ACCOUNT[w]) for w in cur.participants])
    cur = c.run(post).cur
    assert all(c.s.receipts[rid].status == SAMPLED for _, rid, _ in cur.commits)
    everyone = list(cur.participants)
    c.refuse(c.aggregate(post, everyone), "await their verdicts")
    wrong = next(k for k in WORKERS if k.account != cur.aggregator)
    c.refuse(c.aggregate(post, everyone, who=wrong), "not the aggregator")
    bond0 = c.s.account(cheat.account).bond
    votes = []
    for w, rid, _ in cur.commits:
        votes += c.votes(rid, INVALID if w == cheat.account else VALID)
    c.block(*votes)
    assert c.s.account(cheat.account).bond < bond0  # slashed
    c.refuse(c.aggregate(post, everyone), "invalid")
    honest = [w for w in everyone if w != cheat.account]
    a = c.aggregate(post, honest)
    c.block(a)
    c.block()
    c.block(*c.votes(a.id, VALID))
    h = c.run(post).history[-1]
    assert h.accepted == tuple(sorted(honest)) and (cheat.account, "invalid") in h.excluded


def test_invalid_aggregate_is_slashed_and_another_aggregator_drawn():
    c = Chain()
    post = start(c)
    cur = c.run(post).cur
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in cur.participants])
    c.block(*[c.reveal(post, BY_ACCOUNT[w]) for w in cur.participants])
    votes = [v for _, rid, _ in c.run(post).cur.commits if c.s.receipts[rid].status == SAMPLED
             for v in c.votes(rid, VALID)]
    if votes:
        c.block(*votes)
    first = c.run(post).cur.aggregator
    bond0 = c.s.account(first).bond
    params0 = c.run(post).params
    a = c.aggregate(post, list(cur.participants), params_next=b"\x66" * 32)
    c.block(a)
    c.block()
    c.block(*c.votes(a.id, INVALID))
    run = c.run(post)
    assert c.s.account(first).bond < bond0
    assert run.params == params0 and run.round == 0 and run.cur.phase == Phase.AGGREGATE
    c.block()  # the next aggregator is drawn with the next block's beacon
    assert c.run(post).cur.aggregator not in ("", first) and first in c.run(post).cur.tried


def test_round_closes_at_timeout_with_the_minimum_and_reopens_below_it():
    c = Chain()
    post = start(c, min_workers=3)
    cur = c.run(post).cur
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in cur.participants[:3]])  # one worker died
    for _ in range(post.round_timeout):
        c.block()
    assert c.run(post).cur.phase == Phase.REVEAL and len(c.run(post).cur.commits) == 3

    c2 = Chain()
    post2 = start(c2, min_workers=4)
    cur = c2.run(post2).cur
    c2.block(*[c2.receipt(post2, BY_ACCOUNT[w]) for w in cur.participants[:3]])
    for _ in range(post2.round_timeout):
        c2.block()
    run = c2.run(post2)
    assert run.cur.phase == Phase.COMMIT and run.cur.attempt == 1 and run.failed == ((0, 0, "3 committed"),)
    assert run.cur.beacon != cur.beacon
    # the failed attempt's three receipts are paid once final (the work was done as asked), and the run's view
    # lists them under the failed attempt, so an explorer (and a test) can account for every credit paid
    view = run_view(run, c2.s)
    assert [f["round"] for f in view["failed"]] == [0]
    assert sorted(w["worker"] for w in view["failed"][0]["workers"]) == sorted(
        acct(w) for w in cur.participants[:3])
    p = c2.s.params  # a sampled receipt whose committee never votes escalates every verdict_timeout blocks
    for _ in range(p.max_rounds * (p.verdict_timeout + 1) + 20):
        if not c2.run(post2).held and all(c2.s.receipts[r].status in FINAL for r in c2.run(post2).receipts):
            break
        c2.block()
    run = c2.run(post2)
    assert all(c2.s.receipts[r].status in FINAL for r in run.receipts)
    owed = sum(post2.receipt_price - (c2.s.params.committee_fee_bps * post2.receipt_price // 10_000
                                      if c2.s.receipts[r].status == VALID_S else 0) for r in run.receipts)
    assert run.paid_workers == owed > 0 and not run.held


def test_a_reopened_round_waits_longer_for_commits_each_attempt():
    """Attempt a's commit phase lasts round_timeout × (a + 1) blocks (capped): a network slightly too slow for
    round_timeout gets a window it can meet instead of failing every attempt alike."""
    from node.ledger.core.runrounds import MAX_TIMEOUT_STEPS, phase_timeout

    assert [phase_timeout(5, a) for a in (0, 1, 2, 50)] == [5, 10, 15, 5 * MAX_TIMEOUT_STEPS]
    c = Chain()
    post = start(c, min_workers=4)
    lengths = []
    for attempt in range(3):
        cur = c.run(post).cur
        assert cur.phase == Phase.COMMIT and cur.attempt == attempt
        opened, n = cur.phase_height, 0
        while c.run(post).cur.attempt == attempt:
            c.block()
            n += 1
            assert n <= 10 * post.round_timeout
        lengths.append(c.s.height - opened)
    assert lengths == [post.round_timeout * (a + 1) for a in range(3)], lengths
    assert [f[2] for f in c.run(post).failed] == ["0 committed"] * 3


def test_late_joiner_and_leaver_take_effect_at_the_next_round():
    c = Chain()
    post = c.post(min_workers=2, max_workers=4)
    c.block(post)
    c.block(*[RunJoin(c.g.domain, w.account, post.run_id, c.nonce(w)).signed(w) for w in WORKERS[:3]])
    assert set(c.run(post).cur.participants) == {w.account for w in WORKERS[:3]}
    late = WORKERS[3]
    c.block(RunJoin(c.g.domain, late.account, post.run_id, c.nonce(late)).signed(late),
            RunLeave(c.g.domain, WORKERS[0].account, post.run_id, c.nonce(WORKERS[0])).signed(WORKERS[0]))
    assert late.account not in c.run(post).cur.participants
    c.settle_round(post)
    c.block()
    assert set(c.run(post).cur.participants) == {w.account for w in WORKERS[1:]}


def test_deadline_expiry_and_cancel_refund_the_sponsor():
    c = Chain()
    sp0 = c.s.account(SPONSOR.account).balance
    post = c.post(deadline=12)
    c.block(post)
    c.block(RunCancel(c.g.domain, SPONSOR.account, post.run_id, c.nonce(SPONSOR)).signed(SPONSOR))
    assert c.run(post).status == RunStatus.CANCELLED and c.s.account(SPONSOR.account).balance == sp0

    post = start(c, deadline=c.s.height + 6)
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in c.run(post).cur.participants[:2]])
    c.refuse(RunCancel(c.g.domain, SPONSOR.account, post.run_id, 99).signed(SPONSOR), "nonce|first round")
    # the escrow returns once every receipt is final: a receipt the commit close sampled (the run id is random,
    # so the draw is) waits for its committee, which here never votes: it escalates every verdict_timeout blocks
    # and settles as unverified after max_rounds rounds (node.ledger.core.state.end_block)
    p = c.s.params
    for _ in range(p.max_rounds * (p.verdict_timeout + 1) + 20):
        c.block()
        if c.run(post).final_height:
            break
    run = c.run(post)
    assert run.status == RunStatus.EXPIRED and run.final_height and c.s.account(SPONSOR.account).escrow == 0
    assert run.paid_workers > 0  # the two receipts done before the deadline were paid on their verdicts


def test_post_rules():
    c = Chain()
    for bad, why in [({"codec": "zip"}, "codec"), ({"min_workers": 5, "max_workers": 4}, "min_workers"),
                     ({"clip_ppm": 500_000}, "clip_ppm"), ({"price_per_step": 10**12}, "max_receipt_price"),
                     ({"price_per_step": 10**8, "rounds": 10_000}, "budget"), ({"targets": "nope"}, "targets"),
                     ({"deadline": 10**6}, "max_job_deadline"), ({"inner_state": "maybe"}, "inner_state"),
                     ({"codec": "topk", "topk_ppm": 0}, "topk_ppm"),
                     ({"codec": "topk-int4", "topk_ppm": 10**6 + 1}, "topk_ppm")]:
        c.refuse(c.post(advance=False, **bad), why)
    c.block(c.post())  # the same builder with good fields applies
    post = c.post(codec="topk-int4", topk_ppm=10_000)  # a poster's choice of codec, recorded on the ledger
    c.block(post)
    assert (c.run(post).post.codec, c.run(post).post.topk_ppm) == ("topk-int4", 10_000)


def test_wire_round_trip_of_every_run_transaction():
    c = Chain()
    post = start(c)
    r = c.receipt(post, WORKERS[0])
    a = c.aggregate(post, [w.account for w in WORKERS], who=WORKERS[0])
    for tx in (post, r, a, RunJoin(c.g.domain, WORKERS[0].account, post.run_id, 0).signed(WORKERS[0])):
        back = decode_tx(tx.to_wire())
        assert back == tx and back.id == tx.id
        back.check_signatures()
    wire = a.to_wire()
    wire["f"][9] = list(reversed(wire["f"][9]))  # accepted accounts out of canonical order
    with pytest.raises(InvalidTx, match="accepted"):
        decode_tx(wire)
    assert c.run(post).momentum == NO_MOMENTUM


def test_a_finished_runs_receipts_leave_the_hot_state_after_the_retention_window():
    """With retention_blocks set, every round receipt and aggregate of a run stays while the run is open, and all
    leave into the history log ``retention_blocks`` after the run finished (its view then shows them archived);
    with retention 0 they stay."""
    from node.ledger.core import history as hist

    for retention in (0, 4):
        c = Chain(retention_blocks=retention)
        post = start(c)
        for _ in range(post.rounds):
            c.settle_round(post)
        for _ in range(20):
            if c.run(post).status == RunStatus.FINISHED:
                break
            c.block()
        run = c.run(post)
        assert run.status == RunStatus.FINISHED and all(r in c.s.receipts for r in run.receipts)
        n = len(run.receipts)
        for _ in range(retention + 2):
            c.block()
        left = [r for r in run.receipts if r not in c.s.receipts]
        if not retention:
            assert not left and hist.read_head(c.s).size == 0
            continue
        assert len(left) == n and hist.read_head(c.s).size == n  # every one, into the log
        view = run_view(c.run(post), c.s)
        assert all(w["status"] == "unknown" for r in view["rounds_detail"] for w in r["workers"])


# --- issue 24 finding 3, played as an attacker: a Δ belongs to the worker that committed it ---


def test_a_copied_delta_root_is_refused_and_the_round_pays_each_delta_once():
    c = Chain()
    post = start(c)
    victim, copier = WORKERS[0], WORKERS[1]
    r1 = c.receipt(post, victim)
    c.block(r1)  # the victim's delta_root is public now
    # the copier commits the victim's Δ root, with or without copying the rest of the receipt
    c.refuse(c.receipt(post, copier, delta=r1.delta_root), "already committed this delta_root")
    copy = c.receipt(post, copier, delta=r1.delta_root, params_after=r1.params_after, opt_after=r1.opt_after,
                     batches_root=r1.batches_root, opt_before=r1.opt_before, loss_ppm=r1.loss_ppm)
    c.refuse(copy, "already committed this delta_root")
    # the copier's own Δ is fine; the round then runs as usual and pays each worker once
    bal0 = {w.account: c.s.account(w.account).balance for w in WORKERS}
    cur = c.run(post).cur
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in cur.participants if w != victim.account])
    c.block(*[c.reveal(post, BY_ACCOUNT[w]) for w in cur.participants])
    cur = c.run(post).cur
    votes = [v for _, rid, _ in cur.commits if c.s.receipts[rid].status == SAMPLED for v in c.votes(rid, VALID)]
    if votes:
        c.block(*votes)
    everyone = list(cur.participants)
    c.refuse(c.aggregate(post, everyone + [victim.account]), "each worker, and each Δ, once")
    a = c.aggregate(post, everyone)
    c.block(a)
    c.block()
    c.block(*c.votes(a.id, VALID))
    h = c.run(post).history[-1]
    roots = [c.s.receipts[rid].receipt.delta_root for _, rid, _ in h.commits]
    assert len(set(roots)) == len(roots) == 4 and h.accepted == tuple(sorted(everyone))
    for _ in range(8):  # unsampled receipts settle after the challenge window
        c.block()
    fee_bps = c.s.params.committee_fee_bps
    for w in WORKERS:  # each worker paid for its one receipt, no more (plus, at most, the committee fees it earned)
        fees = sum(rec.receipt.price * fee_bps // 10_000 for rec in c.s.receipts.values()
                   if w.account in rec.committee)  # a member who voted shares a verdict's fee; the run id is random,
        gained = c.s.account(w.account).balance - bal0[w.account]  # so which receipts are sampled, and who sits
        assert gained <= post.receipt_price + post.aggregator_fee + fees  # on their committees, is too


def test_a_duplicate_root_in_one_block_lands_once():
    """The copy and its original proposed in one block: the block builder keeps the first, refuses the second."""
    from node.ledger.core.chain import propose

    c = Chain()
    post = start(c)
    r1 = c.receipt(post, WORKERS[0])
    copy = c.receipt(post, WORKERS[1], delta=r1.delta_root)
    block, _new, rejected = propose(c.s, [r1, copy], SPONSOR, 10**6, ())
    assert list(block.txs) == [r1] and [t for t, _ in rejected] == [copy]
    assert "already committed this delta_root" in rejected[0][1]


def test_run_sampling_floor_makes_cheating_a_loss_for_a_thinly_bonded_worker():
    from node.ledger.core.runrounds import run_floor_ppm

    for price, slashable in [(1, 1), (5 * C, 100 * C), (C, 10 * C), (7, 3), (10**6, 10**12)]:
        p = run_floor_ppm(price, slashable)
        assert p * slashable > (10**6 - p) * price  # cheating loses in expectation at the floor...
        assert not (p - 1) * slashable > (10**6 - p + 1) * price  # ...and the floor is the least such rate
    assert run_floor_ppm(C, 0) == 10**6 and run_floor_ppm(0, C) == 0
    # slash_amount 1000 C lets the genesis floor be 2 %, but these workers are bonded with 200 C: a receipt of
    # 10 C needs 4.77 % to deter them, and that is what the run's receipts are sampled at
    c = Chain(slash_amount=1000 * C, max_receipt_price=20 * C)
    post = start(c, price_per_step=2 * C, inner_steps=5, aggregator_fee=C)
    cur = c.run(post).cur
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in cur.participants])
    want = run_floor_ppm(post.receipt_price, 200 * C)
    assert want > 20_000
    for _, rid, _ in c.run(post).cur.commits:
        assert c.s.receipts[rid].p_ppm == want
