"""A server's standing for routing: a cost factor from its verified record on the ledger (issue 39).

Petals' client plans a route by measured speed alone (:func:`node.compute.shards.choose_route` follows it). Here
each hop's estimated time is also multiplied by its server's :func:`standing_factor`, read from the server's ledger
account (a libp2p peer id and a ledger account are the same Ed25519 key): new or punished servers get less work
while servers with a record of valid verdicts are offered, and a server earns its way back one valid verdict at a
time. The trust rule is the ledger's own, BOINC adaptive replication (Anderson, "BOINC: A Platform for Volunteer
Computing", 2019, §5.3; :mod:`node.ledger.core.sampling` samples receipts by it): consecutive valid results
(``valid_run``) earn trust, an invalid result resets the run to 0 and slashes the bond (``slashed`` grows).

The rule, with ``n = valid_run`` and ``P =`` :data:`PROVEN_RUN`::

    factor = 1                                   if n >= P   (proven, whatever its past)
    factor = 1 + (base - 1) * (P - n) / P        otherwise, where
    base   = PUNISHED_FACTOR (3.0)               if slashed > 0 (an invalid verdict, or a drawn tab receipt it
                                                 never revealed: both slash and reset the run)
           = NEW_FACTOR (1.5)                    if never slashed

so a new server pays 1.5x, one just punished 3x, and the factor falls linearly with each valid verdict to 1.0 at
``P``. A factor is finite: it never excludes a server, so the only server covering some blocks is still used.

Absences: an inference server that does not reveal a drawn tab receipt is slashed and its run reset (the tab
rules' forfeit), so it shows here as punished. The batch capability's absences (``WorkerRecord.missed``, a bond
penalty not counted in ``slashed``) live in the batch tables, not on the account, and do not enter.

Pure: no I/O; the caller reads the accounts (:func:`standings` takes the read as a function).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from ..keys import account_from_str

PROVEN_RUN = 10  # consecutive valid verdicts after which a server pays no factor (the ledger's default adapt_step)
NEW_FACTOR = 1.5  # a server with no verdict yet and never slashed
PUNISHED_FACTOR = 3.0  # a slashed server with no valid verdict since


class Record(Protocol):
    """What the standing reads of a ledger account (:class:`node.ledger.core.rows.Account` is one):
    ``valid_run``, consecutive valid verdicts; ``slashed``, base units slashed, cumulative."""

    @property
    def valid_run(self) -> int: ...

    @property
    def slashed(self) -> int: ...


def standing_factor(record: Record) -> float:
    """The cost factor (``1.0 <= factor <= PUNISHED_FACTOR``) of a server whose account is ``record``: see the
    module docstring for the rule. Non-increasing in ``valid_run``; 1.0 from :data:`PROVEN_RUN` on."""
    run = max(0, record.valid_run)
    if run >= PROVEN_RUN:
        return 1.0
    base = PUNISHED_FACTOR if record.slashed > 0 else NEW_FACTOR
    return 1.0 + (base - 1.0) * (PROVEN_RUN - run) / PROVEN_RUN


def standings(peers: Iterable[str], account: Callable[[bytes], Record]) -> dict[str, float]:
    """``{peer: standing_factor}`` for each distinct peer id of ``peers``, reading each one's account once with
    ``account(32-byte key)`` (e.g. the ledger state's ``account``). A peer id that names no Ed25519 key has no
    account: it stands as a new server (:data:`NEW_FACTOR`)."""
    out: dict[str, float] = {}
    for peer in peers:
        if peer in out:
            continue
        try:
            key = account_from_str(peer)
        except ValueError:
            out[peer] = NEW_FACTOR
            continue
        out[peer] = standing_factor(account(key))
    return out


__all__ = ["NEW_FACTOR", "PROVEN_RUN", "PUNISHED_FACTOR", "Record", "standing_factor", "standings"]
