"""Plain (msgpack-able) forms of the ledger's state records, for the tables of :mod:`node.ledger.core.kv`.

A frozen dataclass becomes the list of its fields in declaration order, recursively; a transaction its wire map
(:meth:`node.ledger.core.tx.Tx.to_wire`, decoded again with :func:`node.ledger.core.tx.decode_tx`'s checks); an enum its
value; a tuple a list. Decoding is driven by the dataclass's type hints, so the stored form carries no field
names and no type tags (an Account is six integers). Only this node's own LevelDB is ever decoded here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import enum
import types
import typing
from functools import cache
from typing import Any, Union

from .batchstate import Batch, Item, WorkerRecord
from .jobs import Job
from .kv import Codec
from .runs import Run
from .status import PENDING
from .tx import Receipt, Tx, decode_tx

MAPS = ("accounts", "receipts", "evidence", "sessions", "jobs", "runs", "history", "retire",
        "validators",  # validators: node.ledger.core.valset (empty while min_validator_bond is 0); history, retire:
        # node.ledger.core.history (empty, so absent from the root, while genesis retention_blocks is 0)
        "batches", "batch_items", "batch_due", "batch_workers",  # node.ledger.core.batch (empty until a batch post)
        "disputes")  # node.ledger.core.dispute: receipt id -> height (empty, so absent from the root, until one)
SETS = ("open_receipts", "open_jobs", "open_runs", "open_batches")


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




def to_plain(v: Any) -> Any:
    """The msgpack-able form of a state record (see the module docstring)."""
    if isinstance(v, Tx):
        return v.to_wire()
    if isinstance(v, enum.Enum):
        return v.value
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [to_plain(getattr(v, f.name)) for f in dataclasses.fields(v)]
    if isinstance(v, (tuple, list)):
        return [to_plain(x) for x in v]
    return v


@cache
def _hints(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def from_plain(x: Any, hint: Any) -> Any:
    """Rebuild a value of type ``hint`` from :func:`to_plain`'s output.

    Raises:
        ValueError: ``x`` does not have the shape ``hint`` needs (a store written by another version).
    """
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if x is None:
            return None
        return from_plain(x, args[0])
    if origin is tuple:
        targs = typing.get_args(hint)
        if not isinstance(x, list):
            raise ValueError(f"expected a list for {hint}, got {type(x).__name__}")
        if len(targs) == 2 and targs[1] is Ellipsis:
            return tuple(from_plain(i, targs[0]) for i in x)
        if len(targs) != len(x):
            raise ValueError(f"expected {len(targs)} items for {hint}, got {len(x)}")
        return tuple(from_plain(i, a) for i, a in zip(x, targs, strict=True))
    if hint is Any:
        return x
    if isinstance(hint, type):
        if issubclass(hint, Tx):
            return decode_tx(x)
        if issubclass(hint, enum.Enum):
            return hint(x)
        if dataclasses.is_dataclass(hint):
            fields = _hints(hint)
            if not isinstance(x, list) or len(x) != len(fields):
                raise ValueError(f"expected {len(fields)} fields for {hint.__name__}")
            return hint(**{name: from_plain(v, h) for (name, h), v in zip(fields, x, strict=True)})
        if hint is bytes:
            return bytes(x)
        if hint in (int, str, bool):
            if not isinstance(x, hint):
                raise ValueError(f"expected {hint.__name__}, got {type(x).__name__}")
            return x
    raise ValueError(f"no plain form for {hint!r}")


def _ident(x: Any) -> Any:
    return x


# How each state table's values are stored (LevelDB, node.ledger.statedb) and hashed into the state root
# (node.ledger.core.tree): the same bytes for both.
CODECS: dict[str, Codec[Any]] = {
    "accounts": Codec(lambda a: a.to_list(), lambda x: Account(*x)),
    "receipts": Codec(to_plain, lambda x: from_plain(x, ReceiptRecord)),
    "evidence": Codec(list, lambda x: (int(x[0]), int(x[1]))),
    "sessions": Codec(_ident, bytes),
    "jobs": Codec(to_plain, lambda x: from_plain(x, Job)),
    "runs": Codec(to_plain, lambda x: from_plain(x, Run)),
    # node.ledger.core.valset: account -> (power at height, height+1, height+2, member)
    "validators": Codec(list, lambda x: (int(x[0]), int(x[1]), int(x[2]), int(x[3]))),
    "history": Codec(_ident, _ident),  # b"head" -> [size, root, frontier] (node.ledger.core.history.LogHead)
    "retire": Codec(list, lambda x: tuple(bytes(i) for i in x)),  # leave height -> receipt ids
    # node.ledger.core.batch (records in node.ledger.core.batchstate)
    "batches": Codec(to_plain, lambda x: from_plain(x, Batch)),
    "batch_items": Codec(to_plain, lambda x: from_plain(x, Item)),  # batch id ‖ item (4 bytes) -> Item
    "batch_due": Codec(_ident, int),  # decision height (8 bytes) ‖ batch id ‖ item -> 0
    "batch_workers": Codec(to_plain, lambda x: from_plain(x, WorkerRecord)),
    "disputes": Codec(_ident, int),  # node.ledger.core.dispute: receipt id -> height of the disputing block
    **{name: Codec(_ident, int) for name in SETS},
}
