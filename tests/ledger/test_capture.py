"""The small-network warning (issue 24 finding 8): exactly when two colluders can fill every receipt committee, checked
against the real committee draw (:func:`node.ledger.core.committee.select_committee` over every round)."""

from __future__ import annotations

import os

import pytest

from node.ledger.core import committee as cm
from node.ledger.core.capture import capture_risk, largest_committee
from node.ledger.core.genesis import Params


def fillable_by_two(bonded: int, p: Params, trials: int = 20) -> bool:
    """On the real draw: with ``bonded`` accounts and a receipt whose worker and requester are two of them, does
    every committee of every round have at most 2 members (so that 2 colluders in it hold more than 2/3 of it, and
    no committee exists that they cannot fill)? Also checks that 2 of 3 members would not decide (the quorum rule)."""
    assert cm.tally({b"a": 0, b"b": 0}, 2) == 0 and cm.tally({b"a": 0, b"b": 0}, 3) is None
    accounts = [bytes([i]) * 32 for i in range(bonded)]
    largest = 0
    for _ in range(trials):
        beacon, rid = os.urandom(32), os.urandom(32)
        for r in range(p.max_rounds):
            com = cm.select_committee(beacon, rid, r, accounts, accounts[:2], p.committee_size)
            largest = max(largest, len(com))
    return 2 * largest < 3 * 2


@pytest.mark.parametrize("committee_size,max_rounds", [(2, 3), (3, 3), (1, 2), (2, 1), (4, 1)])
def test_the_warning_matches_the_real_draw(committee_size, max_rounds):
    p = Params(committee_size=committee_size, max_rounds=max_rounds)
    for bonded in range(3, 10):
        warned = capture_risk(bonded, p) is not None
        assert warned == fillable_by_two(bonded, p), (bonded, committee_size, max_rounds)


def test_the_devnet_shape_warns_and_says_what_to_do():
    p = Params(committee_size=2, max_rounds=3)
    text = capture_risk(3, p)
    assert text is not None and "only 3 bonded account(s)" in text and "at most 1 member(s)" in text
    assert "bond at least 5 accounts" in text
    assert capture_risk(5, p) is None and largest_committee(5, p) == 3
    assert largest_committee(100, p) == 8  # committee_size · 2^(max_rounds − 1)
    capped = capture_risk(50, Params(committee_size=2, max_rounds=1))
    assert capped is not None and "genesis limits every committee to 2 members" in capped
