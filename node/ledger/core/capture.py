"""Whether two colluding accounts can fill every receipt committee of a network (issue 24 finding 8).

How committees are drawn (:mod:`node.ledger.core.committee`, :func:`node.ledger.core.state.end_block`): a sampled
receipt's committee in round ``r`` is the first ``committee_size · 2^r`` of the eligible (bonded) accounts other
than the receipt's worker and requester, ranked by the beacon, for rounds ``r < max_rounds``; a verdict needs more
than 2/3 of the committee's size (``3 · votes > 2 · size``). So the pool of one receipt's committees holds
``bonded − 2`` accounts when its worker and requester are both bonded (any account may request), and the largest
committee any of its rounds can draw has ``min(committee_size · 2^(max_rounds − 1), bonded − 2)`` members.

Two colluders decide a committee alone when ``3 · 2 > 2 · size``, i.e. a committee of at most 2 members. When even
the largest committee the network can draw has at most 2 members, **every** committee of such a receipt is one that
two colluders can fill: when they are its pool, they are drawn every time, and no escalation can add an honest
member. That is the condition :func:`capture_risk` reports (``node start`` logs it once as a WARNING,
``/v1/status`` carries it as ``committee_warning``). With a larger pool the colluders are drawn together only by
chance, and an escalation can outvote them.
"""

from __future__ import annotations

from .genesis import Params

COLLUDERS = 2  # the coalition size the warning is about (the "2 colluders")


def largest_committee(bonded: int, p: Params) -> int:
    """Members of the largest receipt committee a network of ``bonded`` eligible accounts can draw for a receipt
    whose worker and requester are both bonded: ``min(committee_size · 2^(max_rounds − 1), bonded − 2)``, at least
    0."""
    rounds = max(1, p.max_rounds)
    return max(0, min(p.committee_size << (rounds - 1), bonded - 2))


def capture_risk(bonded: int, p: Params) -> str | None:
    """A one-line warning when :data:`COLLUDERS` accounts can fill every committee of a receipt (module
    docstring), saying why and what to do; None otherwise."""
    size = largest_committee(bonded, p)
    if 2 * size >= 3 * COLLUDERS:
        return None
    need = 2 + (3 * COLLUDERS + 1) // 2  # bonded accounts for a committee (3 members) 2 colluders cannot decide
    if (p.committee_size << (max(1, p.max_rounds) - 1)) <= 2:
        fix = (f"the genesis limits every committee to {p.committee_size << (max(1, p.max_rounds) - 1)} members "
               "(committee_size · 2^(max_rounds − 1)); a network needs a genesis with larger committees")
    else:
        fix = (f"bond at least {need} accounts (each bonding at least min_bond) so that committees of 3 or more "
               "can be drawn")
    return (f"only {bonded} bonded account(s): a receipt between two bonded accounts is verified by committees of "
            f"at most {size} member(s), which {COLLUDERS} colluding accounts can fill and decide alone "
            f"(a verdict needs more than 2/3 of a committee); {fix}")


__all__ = ["COLLUDERS", "capture_risk", "largest_committee"]
