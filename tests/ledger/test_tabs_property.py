"""Issue 37, check 2: random schedules of tabs, receipts, batches, reveals, withholdings, votes, disputes and closes,
on a real LevelDB store (hypothesis). After every block credits are conserved; at the end, in the reopened store too;
no worker was paid beyond the vouchers its requesters signed; no tab and no escrow went below zero; every batch
with a withheld reveal cost its worker a slash, and a batch with an invalid sampled receipt paid its worker
nothing (its pending credits went back); a replay of the blocks through a follower's checks gives the same
state root."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings, strategies as st

from node.ledger.core.chain import check_and_apply
from node.ledger.core.state import genesis_state
from node.ledger.core.tabs import TabDispute
from node.ledger.core.tx import INVALID, VALID
from node.ledger.store import LedgerStore

from .tabs_helpers import KEYS, C, Chain, tab_genesis

G = tab_genesis()
REQUESTERS, WORKERS = (KEYS[0], KEYS[6]), (KEYS[1], KEYS[2])

action = st.one_of(
    st.tuples(st.just("open"), st.integers(0, 1), st.integers(0, 1), st.integers(1, 8)),
    st.tuples(st.just("topup"), st.integers(0, 9), st.just(0), st.integers(1, 4)),
    st.tuples(st.just("close"), st.integers(0, 9), st.just(0), st.just(0)),
    *[st.tuples(st.just("work"), st.integers(0, 9), st.integers(1, 4), st.integers(1, 3))] * 3,
    st.tuples(st.just("batch"), st.integers(0, 1), st.just(0), st.just(0)),
    *[st.tuples(st.just("reveal"), st.integers(0, 9), st.sampled_from(["all", "all", "all", "one"]), st.just(0))] * 4,
    *[st.tuples(st.just("vote"), st.just(0), st.sampled_from([VALID, VALID, VALID, INVALID]), st.just(0))] * 3,
    *[st.tuples(st.just("dispute"), st.integers(0, 9), st.integers(0, 99), st.just(0))] * 3,
    *[st.tuples(st.just("block"), st.integers(1, 3), st.just(0), st.just(0))] * 3,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, min_size=1, max_size=50))
def test_tabs_and_batches_conserve_credits_and_pay_only_what_was_signed(actions):
    with tempfile.TemporaryDirectory() as d:
        store = LedgerStore(Path(d) / "db", G)
        c = Chain(G, store)
        tabs: list[tuple[bytes, object, object]] = []  # (tab id, requester, worker)
        owed: dict[bytes, tuple[int, int]] = {}  # tab id -> (newest nonce, cumulative) signed so far
        signed_to: dict[bytes, int] = {w.account: 0 for w in WORKERS}  # most each worker's vouchers allow
        work: dict[bytes, list] = {w.account: [] for w in WORKERS}  # receipts not yet in a batch
        batches: list = []  # (batch, receipts, worker)
        withheld, refuted, disputed = set(), set(), set()
        sent: dict[bytes, set[int]] = {}  # batch key -> indices whose reveal was sent
        prefix = [("open", 0, 0, 5), ("open", 1, 1, 5), ("block", 1, 0, 0), ("work", 0, 2, 3), ("work", 1, 2, 3),
                  ("batch", 0, 0, 0), ("batch", 1, 0, 0), ("block", 2, 0, 0)]
        for kind, a, b, n in prefix + list(actions):
            if kind == "open":
                tabs.append((c.open_tab(REQUESTERS[a], WORKERS[b], n * C), REQUESTERS[a], WORKERS[b]))
            elif kind in ("topup", "close") and tabs:
                tab, req, _ = tabs[a % len(tabs)]
                c.topup(req, tab, n * C) if kind == "topup" else c.close(req, tab)
            elif kind == "work" and tabs:
                tab, req, w = tabs[a % len(tabs)]
                nonce, cum = owed.get(tab, (0, 0))
                rs = c.receipts(w, req, tab, [b * C // 2] * n, start_nonce=nonce + 1, start_owed=cum)
                owed[tab] = (nonce + n, rs[-1].cumulative)
                work[w.account] += rs
            elif kind == "batch" and work[WORKERS[a].account]:
                w = WORKERS[a]
                rs, work[w.account] = work[w.account], []
                batches.append((c.batch(w, rs), rs, w))
            elif kind == "reveal" and batches:
                bt, rs, w = batches[a % len(batches)]
                s = c.settlement(bt)
                if s is not None and s.status.value == "revealing" and bt.key not in withheld:
                    done = sent.setdefault(bt.key, set())
                    todo = [i for i in s.draw if i not in done]
                    if b == "one" and len(todo) > 1 and not done:  # one reveal, and never the others
                        withheld.add(bt.key)
                        todo = todo[:1]
                    for i in todo:
                        c.reveal(w, bt, rs, i)
                        done.add(i)
            elif kind == "dispute" and batches:  # the requester of one receipt of a batch disputes it
                bt, rs, w = batches[a % len(batches)]
                r = rs[b % len(rs)]
                req = next(q for q in REQUESTERS if q.account == r.requester)
                c.send(TabDispute(G.domain, req.account, bt.key, r.to_record()).signed(req))
                disputed.add(bt.key)
            elif kind == "vote":
                if b == INVALID:
                    refuted.update(k for bt, _, _ in batches if (k := bt.key) in c.state.tables["settlements"]
                                   and c.settlement(bt).status.value == "checking")
                c.vote_all(b)
            elif kind == "block":
                c.block(a)
            for tab_id in owed:  # what each worker may at most be paid: its tabs' newest signed cumulative
                t = c.state.tables["tabs"].get(tab_id)
                assert t is None or t.locked >= 0
            for acc in c.state.accounts.values():
                assert min(acc.balance, acc.bond, acc.escrow) >= 0
        c.block(G.params.tab_close_delay + G.params.reveal_window + 8)  # let everything come due
        for tab, _, w in tabs:
            signed_to[w.account] += owed.get(tab, (0, 0))[1]
        for w in WORKERS:
            acc = c.state.account(w.account)
            earned = acc.balance - 100 * C  # genesis balance of each worker
            assert earned <= signed_to[w.account] + 10 * C, (earned, signed_to)  # + committee fees it earned
        for bt, _, _w in batches:
            event("withheld" if bt.key in withheld else "refuted" if bt.key in refuted else "other")
            event("disputed" if bt.key in disputed else "not disputed")
        included = sum(isinstance(tx, TabDispute) for blk, _ in c.blocks for tx in blk.txs)
        event(f"disputes included: {min(included, 3)}{'+' if included >= 3 else ''}")
        assert not c.state.tables["tab_disputes"]  # every dispute came to a verdict and returned what was left
        for w in WORKERS:  # a withheld reveal always cost a slash (while the bond lasted)
            n = sum(1 for bt, _, ww in batches if ww is w and bt.key in withheld)
            assert c.state.account(w.account).slashed >= min(200 * C, n * G.params.slash_amount)
        root, supply, settlements = c.state.state_root(), c.state.supply(), dict(c.state.tables["settlements"].items())
        assert supply == c.supply
        store.close()
        again = LedgerStore(Path(d) / "db", G)
        try:
            s2 = again.replay()
            assert s2.state_root() == root and s2.supply() == supply
            assert dict(s2.tables["settlements"].items()) == settlements
        finally:
            again.close()
        replay = genesis_state(G)
        for block, commit in c.blocks:
            replay = check_and_apply(replay, block, commit)
        assert replay.state_root() == root


def test_withheld_and_refuted_batches_pay_nothing_over_many_epochs():
    """The deterministic counterpart: three batches of one worker -- honest, withheld, refuted -- and only the
    honest one's credits reach its balance; the others' return to the tab; a slash for each bad one."""
    c = Chain(G)
    w, req = WORKERS[0], REQUESTERS[0]
    tab = c.open_tab(req, w, 50 * C)
    c.block()
    bal0, slashed0 = c.state.account(w.account).balance, c.state.account(w.account).slashed
    paid = {}
    nonce, cum = 0, 0
    for fate in ("honest", "withheld", "refuted"):
        rs = c.receipts(w, req, tab, [C] * 4, start_nonce=nonce + 1, start_owed=cum)
        nonce, cum = nonce + 4, rs[-1].cumulative
        bt = c.batch(w, rs)
        c.block(2)
        draw = c.settlement(bt).draw
        for i in (draw[:1] if fate == "withheld" else draw):
            c.reveal(w, bt, rs, i)
        c.block(2)
        c.vote_all(INVALID if fate == "refuted" else VALID)
        c.block(4)
        assert c.settlement(bt) is None
        paid[fate] = c.state.account(w.account).balance - bal0 - sum(paid.values())
        c.block(4 - c.state.height % 4)  # the next epoch
    assert paid["withheld"] == 0 and paid["refuted"] == 0 and 3 * C < paid["honest"] < 4 * C
    assert c.state.account(w.account).slashed - slashed0 == 2 * G.params.slash_amount
    assert c.state.tables["tabs"][tab].locked == 50 * C - 4 * C
