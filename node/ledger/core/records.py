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
from functools import cache
from typing import Any, Union

from .kv import Codec
from .module import ident
from .modules import MODULE_MAPS, MODULE_SETS
from .rows import Account, ReceiptRecord
from .tx import TX_KINDS, Tx, decode_tx
from .txbase import arity_fits, build_tx

_SCALARS = frozenset({int, str, bytes, bool, type(None)})


def to_plain(v: Any) -> Any:
    """The msgpack-able form of a state record (see the module docstring).

    On the hot path (every record a block writes is encoded for the state root, the store and the undo record):
    per type, an encoder is generated once (:func:`_plain_of`) that reads the fields by name and passes each
    value on as it is when its type is a scalar, so no field is reflected on and no call is made per scalar."""
    t: Any = type(v)
    if t in _SCALARS:
        return v
    if t is tuple or t is list:
        return [x if type(x) in _SCALARS else to_plain(x) for x in v]
    return _plain_of(t)(v)


def _tx_fields(cls: type[Tx]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A transaction kind's unsigned field names (:meth:`Tx.unsigned`'s order) and signature field names."""
    return (tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.SIGS and f.name != "chain_id"),
            tuple(cls.SIGS))


def _generated(body: str, env: dict[str, Any]) -> Any:
    """``lambda v: <body>`` compiled once (``body`` is built from a class's field names: identifiers)."""
    ns = dict(env)
    exec(f"def encode(v):\n    return {body}\n", ns)  # body: field names of the ledger's own classes
    return ns["encode"]


def _identifiers(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names``, checked to be identifiers (they are written into generated code)."""
    for n in names:
        if not n.isidentifier():  # pragma: no cover - dataclass fields are identifiers
            raise ValueError(f"not a field name: {n!r}")
    return names


def _fields_body(names: tuple[str, ...]) -> str:
    """The list of ``v``'s fields ``names``, each as :func:`to_plain` gives it (scalars inline)."""
    _identifiers(names)
    return "[" + ", ".join(f"(x if type(x := v.{n}) in S else tp(x))" for n in names) + "]"


@cache
def _plain_of(t: type) -> Any:
    """The encoder of values of type ``t`` (not a scalar, tuple or list): as :func:`to_plain` describes."""
    if issubclass(t, Tx):
        names, sigs = _tx_fields(t)
        _identifiers((*names, *sigs))
        wire = _generated('{"t": K, "c": v.chain_id, "f": [' + ", ".join(f"v.{n}" for n in names)
                          + '], "s": [' + ", ".join(f"v.{n}" for n in sigs) + "]}", {"K": t.KIND})

        checked: list[bool] = []

        def tx(v: Any) -> Any:
            if not checked:  # the precomputed form must be exactly Tx.to_wire's, or that is used instead
                checked.append(wire(v) == v.to_wire())
            return wire(v) if checked[0] else v.to_wire()

        return tx
    if issubclass(t, enum.Enum):
        return lambda v: v.value
    if dataclasses.is_dataclass(t):
        return _generated(_fields_body(tuple(f.name for f in dataclasses.fields(t))), {"S": _SCALARS, "tp": to_plain})
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
    if cls is None or not arity_fits(cls, len(x["f"])) or len(x["s"]) != len(cls.SIGS):
        raise ValueError(f"stored transaction of unknown kind or arity {x.get('t')!r}")
    return build_tx(cls, x.get("c"), x["f"], x["s"])


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


MAPS = tuple(MODULE_MAPS)  # each module's tables, in the module tuple's order (node.ledger.core.modules)
SETS = MODULE_SETS


def _codec(v: Any) -> Codec[Any]:
    """A module's table declaration as a codec: a Codec as it is, a record type (dataclass) by its fields."""
    return v if isinstance(v, Codec) else _records(v)


# How each state table's values are stored (LevelDB, node.ledger.statedb) and hashed into the state root
# (node.ledger.core.tree): the same bytes for both.
CODECS: dict[str, Codec[Any]] = {
    **{name: _codec(v) for name, v in MODULE_MAPS.items()},
    **{name: Codec(ident, int) for name in SETS},
}

__all__ = ["CODECS", "MAPS", "SETS", "Account", "ReceiptRecord", "from_plain", "to_plain"]
