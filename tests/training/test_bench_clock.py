"""bench/training_clock.py (issue 40, check 2): a round's wall time on the block clock comes from the ledger's own
quorum rule, driven block by block -- a straggler 3x slower than the rest closes the round at the quorum plus its
grace (not at its own finish) and is left out; without a quorum the round waits for it."""

from __future__ import annotations

import pytest

from bench.training_clock import finish_blocks, round_close
from node.ledger.core.runrounds import QUORUM_GRACE_DIV


def test_finish_blocks_rounds_up_to_whole_blocks():
    assert finish_blocks([0.0, 0.5, 0.51, 9.2]) == (1, 1, 2, 19)
    with pytest.raises(ValueError):
        finish_blocks([-1.0])


def test_a_straggler_closes_nothing_late_under_the_quorum_and_is_left_out():
    fast = (18, 19, 20)
    blocks, took = round_close((3 * 19, *fast), 3)
    grace = max(1, -(-20 // QUORUM_GRACE_DIV))
    assert (blocks, took) == (20 + grace, (1, 2, 3))  # the quorum's third receipt at block 20, then the grace
    assert round_close((3 * 19, *fast), 0) == (57, (0, 1, 2, 3))  # no quorum: the round waits for the straggler
    assert round_close((19, *fast), 3) == (20, (0, 1, 2, 3))  # everyone in: closes as soon as all committed


def test_a_worker_inside_the_grace_still_counts():
    assert round_close((21, 18, 19, 20), 3) == (21, (0, 1, 2, 3))  # grace 2 after block 20
    assert round_close((23, 18, 19, 20), 3) == (22, (1, 2, 3))


def test_a_round_longer_than_the_test_chains_default_deadline_still_closes():
    # a 3x straggler on a loaded machine: 1,200 blocks (10 min) is past the test chain's default run deadline (500)
    assert round_close((1200, 190, 180, 200), 0) == (1200, (0, 1, 2, 3))
    assert round_close((1200, 190, 180, 200), 3) == (220, (1, 2, 3))
