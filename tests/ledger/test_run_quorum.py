"""A run's quorum (issue 40, stragglers): the commit phase closes once ``quorum`` participants committed, after a
grace of a tenth of the blocks that took, so a slow worker stalls no round; its late receipt is refused and never
paid. Driven block by block on the pure ledger state (the supply is checked after every block)."""

from __future__ import annotations

import pytest

from node.ledger.core.runrounds import QUORUM_GRACE_DIV
from node.ledger.core.runs import Phase
from node.ledger.core.tx import InvalidTx, decode_tx

from .test_runs import BY_ACCOUNT, Chain, start


def _commit_at(c: Chain, post, workers, wait: int) -> int:
    """Wait ``wait`` empty blocks, then put ``workers``' receipts in one block; returns that block's height."""
    for _ in range(wait):
        c.block()
    c.block(*[c.receipt(post, BY_ACCOUNT[w]) for w in workers])
    return c.s.height


def test_the_quorum_closes_the_commit_phase_and_the_straggler_is_refused_unpaid():
    c = Chain()
    post = start(c, min_workers=2, quorum=3, round_timeout=200)
    cur = c.run(post).cur
    fast, slow = cur.participants[:3], cur.participants[3]
    reached = _commit_at(c, post, fast, 29)
    grace = max(1, -(-(reached - cur.phase_height) // QUORUM_GRACE_DIV))
    assert grace == 3  # 30 blocks to the quorum: a tenth of that again
    for _ in range(grace - 1):
        c.block()
        assert c.run(post).cur.phase == Phase.COMMIT  # still open during the grace
    c.block()
    run = c.run(post)
    assert run.cur.phase == Phase.REVEAL and c.s.height == reached + grace  # not round_timeout (200) blocks
    assert [w for w, _, _ in run.cur.commits] == list(fast)
    balance = c.s.account(slow).balance
    late = c.receipt(post, BY_ACCOUNT[slow])
    c.refuse(late, "no round in its commit phase")
    c.block(*[c.reveal(post, BY_ACCOUNT[w]) for w in fast])
    assert c.run(post).cur.phase == Phase.AGGREGATE
    assert late.id not in c.s.receipts and c.s.account(slow).balance == balance  # the unused work is not paid


def test_a_worker_within_the_grace_still_counts():
    c = Chain()
    post = start(c, min_workers=2, quorum=3, round_timeout=200)
    cur = c.run(post).cur
    reached = _commit_at(c, post, cur.participants[:3], 29)
    c.block(c.receipt(post, BY_ACCOUNT[cur.participants[3]]))  # one block after the quorum, inside the grace
    run = c.run(post)
    assert run.cur.phase == Phase.REVEAL and c.s.height == reached + 1  # all committed: closes at once
    assert len(run.cur.commits) == 4


def test_without_a_quorum_the_round_waits_for_every_participant_or_the_timeout():
    c = Chain()
    post = start(c, min_workers=2, round_timeout=60)  # quorum 0: today's rule
    cur = c.run(post).cur
    reached = _commit_at(c, post, cur.participants[:3], 29)
    while c.run(post).cur.phase == Phase.COMMIT:
        c.block()
    assert c.s.height == cur.phase_height + 60 > reached + 3  # the straggler held the round to its timeout


def test_quorum_rules_and_its_encoding():
    c = Chain()
    for bad in ({"quorum": 1, "min_workers": 2}, {"quorum": 5, "max_workers": 4}):
        c.refuse(c.post(advance=False, **bad), "quorum")
    plain, with_q = c.post(advance=False), c.post(advance=False, quorum=3)
    # quorum 0 is left out of the wire and the id: a post signed before the field existed keeps its id
    assert len(plain.to_wire()["f"]) == len(plain.SCHEMA) - 1 and len(plain.unsigned()) == len(plain.SCHEMA) - 1
    assert len(with_q.to_wire()["f"]) == len(with_q.SCHEMA)
    for tx in (plain, with_q):
        back = decode_tx(tx.to_wire())
        assert back == tx and back.id == tx.id
        back.check_signatures()
    explicit = plain.to_wire()
    explicit["f"] = [*explicit["f"], 0]  # a second encoding of the same post: refused
    with pytest.raises(InvalidTx, match="left out"):
        decode_tx(explicit)
    short = plain.to_wire()
    short["f"] = short["f"][:-1]
    with pytest.raises(InvalidTx, match="wrong number of fields"):
        decode_tx(short)
