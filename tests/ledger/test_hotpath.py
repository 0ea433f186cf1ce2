"""The receipt hot path of the ledger (issue 27): the faster forms give exactly the results of the plain ones.

* The state tree's decoded-node cache (node/ledger/core/jmtnode.py) holds packed bytes that the cyclic garbage
  collector stops tracking, and an update read through a warm cache writes exactly what a cold one writes.
* Records and transactions are encoded by generated per-class encoders (node/ledger/core/records.py) into the
  bytes the per-field reflection gave, for every record and transaction class.
* ``rows.evolve`` copies an account or a receipt record exactly as ``dataclasses.replace`` does.
"""

from __future__ import annotations

import dataclasses
import enum
import gc
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from node.encoding import H, pack
from node.ledger.core import jmt, jmtnode
from node.ledger.core.modules import MODULE_MAPS
from node.ledger.core.records import CODECS, to_plain
from node.ledger.core.rows import Account, ReceiptRecord, evolve
from node.ledger.core.smt import EMPTY_ROOT, MemoryNodeStore
from node.ledger.core.status import SAMPLED, ReceiptStatus
from node.ledger.core.tx import TX_KINDS, Tx
from node.ledger.core.txbase import Receipt, Verdict

CODECS_BY_CLASS = {v: CODECS[n] for n, v in MODULE_MAPS.items() if dataclasses.is_dataclass(v)}


def _clear_node_cache() -> None:
    jmtnode._dec_hot.clear()
    jmtnode._dec_cold.clear()


def test_tree_updates_through_a_warm_node_cache_write_what_a_cold_one_writes():
    rng = random.Random(27)
    keys = [H(b"hot", i.to_bytes(4, "big")) for i in range(3000)]
    store = MemoryNodeStore()
    root = EMPTY_ROOT
    for v in range(1, 4):  # a tree of ~3,000 keys: its upper nibble levels are full nodes
        res = jmt.update(store, v, root, {k: rng.randbytes(8) for k in keys[(v - 1) * 1000:v * 1000]})
        store.commit(res)
        root = res.root
    for v in range(4, 9):
        batch: dict[bytes, bytes | None] = {k: rng.randbytes(8) for k in rng.sample(keys, 300)}
        batch.update({k: None for k in rng.sample(keys, 20)})
        batch.update({H(b"new", v.to_bytes(4, "big"), i.to_bytes(2, "big")): b"n" for i in range(50)})
        assert jmtnode._dec_hot or jmtnode._dec_cold  # warm: the nodes the last update wrote or read
        warm = jmt.update(store, v, root, batch)
        _clear_node_cache()
        cold = jmt.update(store, v, root, batch)
        assert (warm.root, warm.writes, warm.stale) == (cold.root, cold.writes, cold.stale)
        store.commit(warm)
        root = warm.root
    entries = [*jmtnode._dec_hot.values(), *jmtnode._dec_cold.values()]
    assert entries and all(isinstance(e, tuple) and len(e) == 2 and all(type(x) is bytes for x in e)
                           for e in entries)
    gc.collect()
    assert not any(gc.is_tracked(e) for e in entries)  # nothing for later collections to walk


# ---------------------------------------------------------------- records.to_plain's generated encoders

def _reference_plain(v: Any) -> Any:
    """records.to_plain as it was before its encoders were generated (per-field reflection): the reference."""
    t: Any = type(v)
    if t in (int, str, bytes, bool, type(None)):
        return v
    if t is tuple or t is list:
        return [_reference_plain(x) for x in v]
    if issubclass(t, Tx):
        return v.to_wire()
    if issubclass(t, enum.Enum):
        return v.value
    if dataclasses.is_dataclass(t):
        return [_reference_plain(getattr(v, f.name)) for f in dataclasses.fields(t)]
    if issubclass(t, (tuple, list)):
        return [_reference_plain(x) for x in v]
    return v


def _typed(x: Any) -> Any:
    """``x`` with every value's exact type beside it (``==`` alone equates True and 1, a StrEnum and its str)."""
    if isinstance(x, list):
        return ("list", [_typed(i) for i in x])
    if isinstance(x, dict):
        return ("dict", [(_typed(k), _typed(v)) for k, v in x.items()])
    return (type(x).__name__, x)


def _same_bytes(v: Any) -> None:
    new, ref = to_plain(v), _reference_plain(v)
    assert _typed(new) == _typed(ref)
    try:
        raw = pack(ref)
    except OverflowError:  # an int beyond msgpack's 64 bits (the ledger's checks refuse those first)
        return
    assert pack(new) == raw
    if type(v) in CODECS_BY_CLASS:
        assert CODECS_BY_CLASS[type(v)].dumps(v) == raw


_RECORDS = sorted({v for v in MODULE_MAPS.values() if dataclasses.is_dataclass(v)}, key=lambda c: c.__name__)
_TXS = [TX_KINDS[k] for k in sorted(TX_KINDS)]
_ENUMS = st.sampled_from([*ReceiptStatus, *Verdict])  # enum values where a field says str or int


@pytest.mark.parametrize("cls", _RECORDS + _TXS, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_encoders_give_the_bytes_of_per_field_reflection(cls, data):
    v = data.draw(st.builds(cls))
    _same_bytes(v)
    # the same record with enums and nested tuples where plain values are declared
    names = [f.name for f in dataclasses.fields(cls)]
    swapped = {n: data.draw(_ENUMS) for n in data.draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
               if isinstance(getattr(v, n), str | int) and not isinstance(getattr(v, n), bool)}
    w = dataclasses.replace(v, **swapped)
    _same_bytes(w)
    _same_bytes((w, [v, (w,)]))


def test_a_receipt_record_encodes_as_before():
    rec = ReceiptRecord(receipt=Receipt("c", b"s" * 16, b"w" * 32, b"r" * 32, b"m" * 32, 0, 4, 7, b"i" * 32,
                                        b"o" * 32, 7, 3, "none", b"x" * 64, b"y" * 64),
                        height=5, status=SAMPLED, p_ppm=10, committee=(b"a" * 32,),
                        votes=((b"a" * 32, 0, Verdict.VALID, 5),), payouts=((b"w" * 32, 7),))
    assert CODECS_BY_CLASS[ReceiptRecord].dumps(rec) == pack(_reference_plain(rec))
    assert to_plain(rec)[2] == "sampled" and type(to_plain(rec)[2]) is str


# ---------------------------------------------------------------- rows.evolve (dataclasses.replace on the hot path)

@pytest.mark.parametrize("cls", [Account, ReceiptRecord], ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_evolve_is_dataclasses_replace_for_the_rows(cls, data):
    v = data.draw(st.builds(cls))
    names = [f.name for f in dataclasses.fields(cls)]
    fresh = data.draw(st.builds(cls))
    changes = {n: getattr(fresh, n) for n in data.draw(st.lists(st.sampled_from(names), unique=True))}
    got, want = evolve(v, **changes), dataclasses.replace(v, **changes)
    assert type(got) is cls and got == want and hash(got) == hash(want) and vars(got) == vars(want)
    assert _typed(to_plain(got)) == _typed(to_plain(want))
    assert v == dataclasses.replace(v)  # the original is unchanged
    with pytest.raises(TypeError):
        evolve(v, not_a_field=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.height = 1 if cls is ReceiptRecord else got.balance  # type: ignore[misc]


def test_evolve_leaves_a_class_it_cannot_copy_by_dict_to_dataclasses_replace():
    r = Receipt("c", b"s" * 16, b"w" * 32, b"r" * 32, b"m" * 32, 0, 4, 7, b"i" * 32, b"o" * 32, 7, 3, "none",
                b"x" * 64, b"y" * 64)
    rid = r.id  # cached on the instance: a copy of its __dict__ would carry the old id
    moved = evolve(r, tokens=8, price=8)
    assert moved == dataclasses.replace(r, tokens=8, price=8) and moved.id != rid
