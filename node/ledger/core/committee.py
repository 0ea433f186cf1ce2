"""Committee selection and vote tally (pure).

Members are ranked by ``H(beacon ‖ receipt_id ‖ round ‖ member)`` among eligible (bonded) accounts, excluding
the worker and the requester, and the first ``k · 2^round`` are taken: a round without a quorum escalates to a
committee twice as large (DESIGN.md, Verification §2–3). Ranking hashes every eligible account, O(n) per receipt:
with more than :data:`RANK_ALL` eligible accounts (issue 37: thousands of servers, hundreds of sampled receipts a
block) the members are drawn instead, each uniformly from the eligible accounts in byte order at index
``H("tally/committee-index/v1" ‖ beacon ‖ receipt_id ‖ round ‖ j) mod n`` for j = 0, 1, ..., skipping the excluded
and those drawn already: the same distribution (uniform without replacement, fixed by a beacon nobody knew) in
O(k) hashes. Chains with at most :data:`RANK_ALL` bonded accounts (every chain before) draw as before.

A verdict is final when more than 2/3 of the committee agree (``3 · votes > 2 · size``, the Tendermint
quorum rule, arXiv:1807.04938 §2). Abstentions count toward nobody.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping

from ...encoding import H
from .txbase import ABSTAIN, INVALID, VALID, Verdict


def committee_size(k: int, round_: int) -> int:
    """Committee size in escalation round ``round_``: ``k · 2^round``."""
    return k << round_


RANK_ALL = 256  # up to this many eligible accounts, every one is ranked (see the module docstring)


def select_committee(beacon: bytes, receipt_id: bytes, round_: int, eligible: Iterable[bytes],
                     exclude: Iterable[bytes], k: int) -> tuple[bytes, ...]:
    """The committee for a receipt in a round: the ``k · 2^round`` lowest-ranked eligible accounts, or (more than
    :data:`RANK_ALL` eligible) as many drawn by hashed index. ``eligible`` may be a tuple already sorted and without
    repeats (read once per block by the caller), else any iterable.

    Returns fewer members when fewer are eligible (possibly none).
    """
    ex = set(exclude)
    pool = eligible if isinstance(eligible, tuple) else tuple(sorted(set(eligible)))
    if len(pool) > RANK_ALL:
        return _drawn(beacon, receipt_id, round_, pool, ex, committee_size(k, round_))
    cands = sorted(set(pool) - ex)
    ranked = sorted(cands, key=lambda m: H(b"tally/committee/v1", beacon, receipt_id,
                                          round_.to_bytes(4, "big"), m))
    return tuple(ranked[: committee_size(k, round_)])


def _drawn(beacon: bytes, receipt_id: bytes, round_: int, pool: tuple[bytes, ...], ex: set[bytes],
           size: int) -> tuple[bytes, ...]:
    """``size`` distinct members of sorted ``pool`` not in ``ex``, drawn by hashed index (module docstring)."""
    present = sum(1 for e in ex if (i := bisect_left(pool, e)) < len(pool) and pool[i] == e)
    want = min(size, len(pool) - present)
    picks: dict[bytes, None] = {}
    j, rnd = 0, round_.to_bytes(4, "big")
    while len(picks) < want:
        i = int.from_bytes(H(b"tally/committee-index/v1", beacon, receipt_id, rnd, j.to_bytes(8, "big")), "big")
        m = pool[i % len(pool)]
        j += 1
        if m not in ex:
            picks.setdefault(m, None)
    return tuple(picks)


def tally(votes: Mapping[bytes, int], size: int) -> Verdict | None:
    """Final verdict (VALID or INVALID) if > 2/3 of a committee of ``size`` agree, else None."""
    if size <= 0:
        return None
    for verdict in (VALID, INVALID):
        n = sum(1 for v in votes.values() if v == verdict)
        if 3 * n > 2 * size:
            return verdict
    return None


def deadlocked(votes: Mapping[bytes, int], size: int) -> bool:
    """True when every member has voted (abstentions included) and no verdict has a quorum."""
    return len(votes) >= size and tally(votes, size) is None


__all__ = ["ABSTAIN", "INVALID", "VALID", "committee_size", "deadlocked", "select_committee", "tally"]
