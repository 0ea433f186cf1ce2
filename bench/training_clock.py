"""A run round's wall time on a block clock, decided by the ledger's own state machine (issue 40, stragglers).

:func:`round_close` drives the real pure ledger (``node.ledger.core.state.apply_block_body``, through the test
chain of ``tests/ledger/test_runs.py``: genesis, a posted run with ``quorum``, four joined workers) block by block:
worker ``k`` puts its round receipt in the block ``ceil(t_k / block_s)`` after the commit phase opened (``t_k`` =
its compute time in seconds), and the commit phase closes wherever ``node.ledger.core.runrounds`` closes it (every
participant committed, or ``quorum`` of them plus ``QUORUM_GRACE_DIV``'s grace). A receipt the ledger refuses
(its phase closed) is a Δ left out of the outer step, as in a real run. Only the commit phase is timed: reveal and
aggregate take a few blocks whoever trained, the same with or without a straggler.
"""

from __future__ import annotations

import math
from functools import lru_cache

from node.ledger.core.runs import Phase
from node.ledger.core.state import apply_tx
from node.ledger.core.tx import InvalidTx
from tests.ledger.test_runs import BY_ACCOUNT, WORKERS, Chain, start

BLOCK_S = 0.5  # the devnet's block time (seconds)
ROUND_TIMEOUT = 10_000  # blocks: the largest a post may set, so only the quorum (or every commit) closes a round


def finish_blocks(times_s: list[float], block_s: float = BLOCK_S) -> tuple[int, ...]:
    """The block (counted from the commit phase's start, >= 1) whose receipt carries each worker's Δ."""
    if block_s <= 0 or any(not math.isfinite(t) or t < 0 for t in times_s):
        raise ValueError(f"block_s must be > 0 and times finite and >= 0, got {block_s}, {times_s}")
    return tuple(max(1, math.ceil(t / block_s)) for t in times_s)


@lru_cache(maxsize=4096)
def round_close(blocks: tuple[int, ...], quorum: int) -> tuple[int, tuple[int, ...]]:
    """``(blocks the commit phase lasted, indices of the workers the ledger took)`` for receipts at ``blocks``.

    ``blocks[k]``: the block (after the phase start) in which worker ``k`` sends its receipt; ``quorum``: the
    run's ``RunPost.quorum`` (0 = every participant). Raises ValueError for more workers than the test chain has
    (4) or blocks past the round timeout.
    """
    if not 1 <= len(blocks) <= len(WORKERS) or min(blocks) < 1 or max(blocks) >= ROUND_TIMEOUT:
        raise ValueError(f"1..{len(WORKERS)} workers with blocks in 1..{ROUND_TIMEOUT - 1}, got {blocks}")
    c = Chain()
    post = start(c, min_workers=min(len(blocks), max(1, quorum or len(blocks))), max_workers=len(WORKERS),
                 quorum=quorum, round_timeout=ROUND_TIMEOUT,
                 deadline=c.s.height + 2 * ROUND_TIMEOUT)  # the run outlives any round timed here
    cur = c.run(post).cur
    who = list(cur.participants)[:len(blocks)]  # worker k is the k-th participant
    rest = list(cur.participants)[len(blocks):]  # participants beyond the bench's K never commit
    if rest and not quorum:
        raise ValueError("fewer workers than the chain's participants needs a quorum")
    t0 = cur.phase_height
    for b in range(1, max(blocks) + 1):
        if c.run(post).cur.phase != Phase.COMMIT:
            break
        c.block(*[c.receipt(post, BY_ACCOUNT[who[k]]) for k in range(len(blocks)) if blocks[k] == b])
    while c.run(post).cur.phase == Phase.COMMIT:  # every receipt is in: the phase closes now
        c.block()
    run = c.run(post)
    took = {w for w, _, _ in run.cur.commits}
    for k in range(len(blocks)):  # the ledger itself refuses a receipt once the phase closed (never paid)
        if who[k] in took:
            continue
        try:
            apply_tx(c.s.copy(), c.receipt(post, BY_ACCOUNT[who[k]]))
        except InvalidTx:
            continue
        raise RuntimeError(f"the ledger took worker {k}'s late receipt")
    return int(run.cur.phase_height - t0), tuple(k for k in range(len(blocks)) if who[k] in took)
