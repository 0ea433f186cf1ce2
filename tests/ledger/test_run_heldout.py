"""An aggregate's held-out loss claim (RoundAggregate.heldout_ppm, issue 40) on the pure ledger: optional (an
aggregate without it keeps its encoding and id), carried on the wire, bounded, and shown per round by the run's
view (checked by the committee in node.training.replay: tests/training/test_heldout.py)."""

from __future__ import annotations

import dataclasses

import pytest

from node.ledger.core.runs import Phase
from node.ledger.core.tx import VALID, InvalidTx, decode_tx
from node.training.api import run_view
from node.web.views import acct

from .test_runs import BY_ACCOUNT, Chain, start


def _to_aggregate(c: Chain, post):
    cur = c.run(post).cur
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in cur.participants])
    c.block(*[c.reveal(post, BY_ACCOUNT[w]) for w in cur.participants])
    for _ in range(20):  # the sampled receipts' verdicts are not needed: sample_ppm 0 leaves most unsampled
        if all(c.s.receipts[r].status != "sampled" for _, r, _ in c.run(post).cur.commits):
            break
        rids = [r for _, r, _ in c.run(post).cur.commits if c.s.receipts[r].status == "sampled"]
        c.block(*[v for r in rids for v in c.votes(r, VALID)])
    assert c.run(post).cur.phase == Phase.AGGREGATE
    return cur


def test_an_aggregates_held_out_claim_is_optional_carried_bounded_and_shown():
    c = Chain()
    post = start(c, min_workers=3)
    cur = _to_aggregate(c, post)
    plain = c.aggregate(post, list(cur.participants))
    agg = BY_ACCOUNT[plain.aggregator]
    claimed = dataclasses.replace(plain, heldout_ppm=2_345_678, sig=b"").signed(agg)
    assert len(plain.to_wire()["f"]) == len(plain.SCHEMA) - 1  # none claimed: the encoding signed before
    back = decode_tx(claimed.to_wire())
    assert back == claimed and back.heldout_ppm == 2_345_678 and back.id != plain.id
    c.refuse(dataclasses.replace(plain, heldout_ppm=10**9, sig=b"").signed(agg), "heldout_ppm")
    c.block(claimed)
    assert c.run(post).cur.phase == Phase.CHECK
    view = run_view(c.run(post), c.s)
    assert view["current"]["aggregate"]["heldout_loss"] == pytest.approx(2.345678)
    c.block()  # the aggregate is sampled at the next block; its committee finds it valid
    c.block(*c.votes(claimed.id, VALID))
    view = run_view(c.run(post), c.s)
    assert view["heldout_per_round"] == [pytest.approx(2.345678)]
    assert view["bytes_per_worker"] == [{acct(w): 1000 for w in cur.participants}]  # the receipts' delta_bytes


def test_a_claim_on_the_wire_with_a_trailing_zero_is_refused():
    c = Chain()
    post = start(c, min_workers=3)
    cur = _to_aggregate(c, post)
    wire = c.aggregate(post, list(cur.participants)).to_wire()
    wire["f"] = [*wire["f"], 0]
    with pytest.raises(InvalidTx, match="left out"):
        decode_tx(wire)
