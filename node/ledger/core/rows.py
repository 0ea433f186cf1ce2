"""The core's own state rows: an account (:class:`Account`) and a receipt's ledger record (:class:`ReceiptRecord`).

Below every capability module and the state: the narrow state view (:mod:`node.ledger.core.view`) names them,
and :mod:`node.ledger.core.records` stores them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from .status import PENDING
from .txbase import Receipt


@dataclass(frozen=True)
class Account:
    """Per-account state in base units. ``valid_run``: consecutive valid verdicts (adaptive sampling)."""

    balance: int = 0
    bond: int = 0
    escrow: int = 0
    nonce: int = 0
    valid_run: int = 0
    slashed: int = 0

    def to_list(self) -> list[int]:
        return [self.balance, self.bond, self.escrow, self.nonce, self.valid_run, self.slashed]


@dataclass(frozen=True)
class ReceiptRecord:
    """Ledger summary of a receipt (no tensors) and its verification status."""

    receipt: Receipt
    height: int
    status: str = PENDING
    p_ppm: int = 0
    round: int = 0
    round_height: int = 0
    committee: tuple[bytes, ...] = ()
    votes: tuple[tuple[bytes, int, int, int], ...] = ()  # (voter, round, verdict, distance_ppm)
    final_height: int = 0
    payouts: tuple[tuple[bytes, int], ...] = ()  # (account, base units), incl. the requester's refund
    slashed: int = 0

    def round_votes(self) -> dict[bytes, int]:
        return {v: verdict for v, r, verdict, _ in self.votes if r == self.round}

    def to_dict(self) -> dict[Any, Any]:
        r = self.receipt
        return {"id": r.id, "receipt": r.to_wire(), "height": self.height, "status": self.status,
                "p_ppm": self.p_ppm, "round": self.round, "committee": list(self.committee),
                "votes": [list(v) for v in self.votes], "final_height": self.final_height,
                "payouts": [list(p) for p in self.payouts], "slashed": self.slashed}


T = TypeVar("T")
_new = object.__new__


@cache
def _plain_fields(cls: type) -> frozenset[str] | None:
    """The field names of ``cls`` when a copy of its instance with some fields changed is exactly its
    ``__dict__`` with those entries changed: a dataclass without ``__slots__``, ``__post_init__``, init-less or
    init-only fields. None otherwise (:func:`evolve` then calls :func:`dataclasses.replace`)."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__slots__") or hasattr(cls, "__post_init__"):
        return None
    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields) or any(isinstance(v, dataclasses.InitVar) for v in vars(cls).values()):
        return None
    return frozenset(f.name for f in fields)


def evolve(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` for the state rows on the hot path (an account or a receipt record
    changes several times per receipt), ~3x faster: for a plain dataclass (see :func:`_plain_fields`) whose
    instance holds its fields alone, the copy is made from its ``__dict__`` without the reflection and the
    per-field ``object.__setattr__`` of a frozen ``__init__``; anything else goes to ``dataclasses.replace``.
    The values are not converted or checked (neither does ``replace`` for these classes).

    Raises:
        TypeError: a name in ``changes`` is not a field of ``obj`` (as ``dataclasses.replace`` does).
    """
    cls: type = type(obj)
    names = _plain_fields(cls)
    d = getattr(obj, "__dict__", None)
    if names is None or d is None or len(d) != len(names) or not names.issuperset(changes):
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    out: T = _new(cls)
    out.__dict__.update(d, **changes)
    return out


__all__ = ["Account", "ReceiptRecord", "evolve"]
