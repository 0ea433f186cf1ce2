"""Committee selection and vote tally (pure).

Members are ranked by ``H(beacon ‖ receipt_id ‖ round ‖ member)`` among eligible (bonded) accounts, excluding
the worker and the requester, and the first ``k · 2^round`` are taken: a round without a quorum escalates to a
committee twice as large (DESIGN.md, Verification §2–3).

A verdict is final when more than 2/3 of the committee agree (``3 · votes > 2 · size``, the Tendermint
quorum rule, arXiv:1807.04938 §2). Abstentions count toward nobody.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...encoding import H
from .txbase import ABSTAIN, INVALID, VALID, Verdict


def committee_size(k: int, round_: int) -> int:
    """Committee size in escalation round ``round_``: ``k · 2^round``."""
    return k << round_


def select_committee(beacon: bytes, receipt_id: bytes, round_: int, eligible: Iterable[bytes],
                     exclude: Iterable[bytes], k: int) -> tuple[bytes, ...]:
    """The committee for a receipt in a round: the ``k · 2^round`` lowest-ranked eligible accounts.

    Returns fewer members when fewer are eligible (possibly none).
    """
    ex = set(exclude)
    cands = sorted(set(eligible) - ex)
    ranked = sorted(cands, key=lambda m: H(b"tally/committee/v1", beacon, receipt_id,
                                          round_.to_bytes(4, "big"), m))
    return tuple(ranked[: committee_size(k, round_)])


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
