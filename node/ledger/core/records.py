"""Plain (msgpack-able) forms of the ledger's state records, for the tables of :mod:`node.ledger.core.kv`.

A frozen dataclass becomes the list of its fields in declaration order, recursively; a transaction its wire map
(:meth:`node.ledger.core.tx.Tx.to_wire`, decoded again with :func:`node.ledger.core.tx.decode_tx`'s checks); an enum its
value; a tuple a list. Decoding is driven by the dataclass's type hints, so the stored form carries no field
names and no type tags (an Account is six integers). Only this node's own LevelDB is ever decoded here.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Union

from .batchstate import Batch, Item, WorkerRecord
from .jobs import Job
from .kv import Codec
from .runs import Run
from .status import PENDING
from .tx import TX_KINDS, Receipt, Tx, decode_tx

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




_SCALARS = frozenset({int, str, bytes, bool, type(None)})


def to_plain(v: Any) -> Any:
    """The msgpack-able form of a state record (see the module docstring).

    On the hot path (every record a block writes is encoded for the state root and the store): per type, the
    field names are looked up once (:func:`_plain_of`), not reflected on every call."""
    t: Any = type(v)
    if t in _SCALARS:
        return v
    if t is tuple or t is list:
        return [to_plain(x) for x in v]
    return _plain_of(t)(v)


def _tx_fields(cls: type[Tx]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A transaction kind's unsigned field names (:meth:`Tx.unsigned`'s order) and signature field names."""
    return (tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.SIGS and f.name != "chain_id"),
            tuple(cls.SIGS))


@cache
def _plain_of(t: type) -> Any:
    """The encoder of values of type ``t`` (not a scalar, tuple or list): as :func:`to_plain` describes."""
    if issubclass(t, Tx):
        names, sigs, kind = *_tx_fields(t), t.KIND

        def wire(v: Any) -> Any:
            return {"t": kind, "c": v.chain_id, "f": [getattr(v, n) for n in names],
                    "s": [getattr(v, n) for n in sigs]}

        checked: list[bool] = []

        def tx(v: Any) -> Any:
            if not checked:  # the precomputed form must be exactly Tx.to_wire's, or that is used instead
                checked.append(wire(v) == v.to_wire())
            return wire(v) if checked[0] else v.to_wire()

        return tx
    if issubclass(t, enum.Enum):
        return lambda v: v.value
    if dataclasses.is_dataclass(t):
        fields = tuple(f.name for f in dataclasses.fields(t))
        return lambda v: [to_plain(getattr(v, n)) for n in fields]
    if issubclass(t, (tuple, list)):
        return lambda v: [to_plain(x) for x in v]
    return lambda v: v


@cache
def _hints(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def from_plain(x: Any, hint: Any, trusted: bool = False) -> Any:
    """Rebuild a value of type ``hint`` from :func:`to_plain`'s output.

    ``trusted``: ``x`` was read from this node's own store (it wrote it): transactions inside are rebuilt without
    :func:`node.ledger.core.tx.decode_tx`'s per-field checks (they were checked before they were stored). Shapes
    are checked either way.

    Raises:
        ValueError: ``x`` does not have the shape ``hint`` needs (a store written by another version).
    """
    return _decoder(hint, trusted)(x)


def _tx_trusted(x: Any) -> Tx:
    """A transaction from its stored wire map, without decode_tx's field checks (trusted bytes only)."""
    if not (isinstance(x, dict) and isinstance(x.get("f"), list) and isinstance(x.get("s"), list)):
        raise ValueError("a stored transaction is a wire map")
    cls = TX_KINDS.get(str(x.get("t")))
    if cls is None or len(x["f"]) != len(cls.SCHEMA) or len(x["s"]) != len(cls.SIGS):
        raise ValueError(f"stored transaction of unknown kind or arity {x.get('t')!r}")
    return cls(x.get("c"), *x["f"], *x["s"])  # type: ignore[arg-type]


@cache
def _decoder(hint: Any, trusted: bool) -> Any:
    """The decoder for ``hint`` (built once per type hint: the hints are walked here, not on every value)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = _decoder(next(a for a in typing.get_args(hint) if a is not type(None)), trusted)
        return lambda x: None if x is None else inner(x)
    if origin is tuple:
        targs = typing.get_args(hint)
        if len(targs) == 2 and targs[1] is Ellipsis:
            each = _decoder(targs[0], trusted)

            def many(x: Any) -> Any:
                if not isinstance(x, list):
                    raise ValueError(f"expected a list for {hint}, got {type(x).__name__}")
                return tuple(each(i) for i in x)

            return many
        parts = tuple(_decoder(a, trusted) for a in targs)

        def fixed(x: Any) -> Any:
            if not isinstance(x, list):
                raise ValueError(f"expected a list for {hint}, got {type(x).__name__}")
            if len(parts) != len(x):
                raise ValueError(f"expected {len(parts)} items for {hint}, got {len(x)}")
            return tuple(d(i) for d, i in zip(parts, x, strict=True))

        return fixed
    if hint is Any:
        return lambda x: x
    if isinstance(hint, type):
        if issubclass(hint, Tx):
            return _tx_trusted if trusted else decode_tx
        if issubclass(hint, enum.Enum):
            return hint
        if dataclasses.is_dataclass(hint):
            fields = _hints(hint)
            names = tuple(n for n, _ in fields)
            decs = tuple(_decoder(h, trusted) for _, h in fields)
            cls = hint

            def record(x: Any) -> Any:
                if not isinstance(x, list) or len(x) != len(names):
                    raise ValueError(f"expected {len(names)} fields for {cls.__name__}")
                return cls(**{n: d(v) for n, d, v in zip(names, decs, x, strict=True)})

            return record
        if hint is bytes:
            return bytes
        if hint in (int, str, bool):
            def scalar(x: Any) -> Any:
                if not isinstance(x, hint):
                    raise ValueError(f"expected {hint.__name__}, got {type(x).__name__}")
                return x

            return scalar
    raise ValueError(f"no plain form for {hint!r}")


def _records(cls: type) -> Codec[Any]:
    """The codec of a table of ``cls`` records: :func:`to_plain`; :func:`from_plain`, trusted for this node's own
    store (:meth:`node.ledger.core.kv.Codec.loads_local`)."""
    return Codec(to_plain, lambda x: from_plain(x, cls), lambda x: from_plain(x, cls, True))


def _ident(x: Any) -> Any:
    return x


# How each state table's values are stored (LevelDB, node.ledger.statedb) and hashed into the state root
# (node.ledger.core.tree): the same bytes for both.
CODECS: dict[str, Codec[Any]] = {
    "accounts": Codec(lambda a: a.to_list(), lambda x: Account(*x)),
    "receipts": _records(ReceiptRecord),
    "evidence": Codec(list, lambda x: (int(x[0]), int(x[1]))),
    "sessions": Codec(_ident, bytes),
    "jobs": _records(Job),
    "runs": _records(Run),
    # node.ledger.core.valset: account -> (power at height, height+1, height+2, member)
    "validators": Codec(list, lambda x: (int(x[0]), int(x[1]), int(x[2]), int(x[3]))),
    "history": Codec(_ident, _ident),  # b"head" -> [size, root, frontier] (node.ledger.core.history.LogHead)
    "retire": Codec(list, lambda x: tuple(bytes(i) for i in x)),  # leave height -> receipt ids
    # node.ledger.core.batch (records in node.ledger.core.batchstate)
    "batches": _records(Batch),
    "batch_items": _records(Item),  # batch id ‖ item (4 bytes) -> Item
    "batch_due": Codec(_ident, int),  # decision height (8 bytes) ‖ batch id ‖ item -> 0
    "batch_workers": _records(WorkerRecord),
    "disputes": Codec(_ident, int),  # node.ledger.core.dispute: receipt id -> height of the disputing block
    **{name: Codec(_ident, int) for name in SETS},
}
