"""The receipt hot path of the ledger (issue 27): the faster forms give exactly the results of the plain ones.

* The state tree's decoded-node cache (node/ledger/core/jmtnode.py) holds packed bytes that the cyclic garbage
  collector stops tracking, and an update read through a warm cache writes exactly what a cold one writes.
* Records and transactions are encoded by generated per-class encoders (node/ledger/core/records.py) into the
  bytes the per-field reflection gave, for every record and transaction class.
* ``kv.Table.pairs`` (one scan, for the open sets' iteration) reads exactly what ``items()`` reads.
* The explorer index of a block is built from the receipts it wrote, in the open set's order, as from every one.
* The head's commit is read from its stored record without building the block's transactions, as before.
* The tree's hashes, computed from prefix states, are the hashes of the concatenations they stand for.
* ``rows.evolve`` copies an account or a receipt record exactly as ``dataclasses.replace`` does.
"""

from __future__ import annotations

import dataclasses
import enum
import gc
import random
from typing import Any

import plyvel
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from node.encoding import DecodeError, H, pack, unpack_local
from node.ledger import explorer_index
from node.ledger.core import blockcodec, jmt, jmtnode, smtnode, tree
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.kv import Codec, OrderedSet, StoreRoot, Table
from node.ledger.core.modules import MODULE_MAPS
from node.ledger.core.records import CODECS, to_plain
from node.ledger.core.rows import Account, ReceiptRecord, evolve
from node.ledger.core.smtnode import EMPTY_ROOT, MemoryNodeStore
from node.ledger.core.status import SAMPLED, ReceiptStatus
from node.ledger.core.tx import TX_KINDS, Tx
from node.ledger.core.txbase import VALID, Receipt, Verdict
from node.ledger.explorer_index import index_block
from node.ledger.store import LedgerStore
from tests.ledger.helpers import KEYS, VALIDATOR, make_genesis, make_receipt, vote

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


# ---------------------------------------------------------------- kv.Table.pairs (the open sets' iteration)

INT = Codec(lambda v: v, int)


def _same_pairs(t: Table) -> None:
    assert t.pairs() == list(t.items())


@pytest.mark.parametrize("seed", range(4))
def test_pairs_is_items_over_leveldb_at_every_step_of_a_commit(tmp_path, seed):
    rng = random.Random(seed)
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    head = Table(StoreRoot(db, b"t/", INT, cache_items=rng.choice([2, 8, 1000]), count=0))
    history = [head]
    try:
        for _ in range(25):
            work = head.child()
            for layer in range(rng.choice([1, 2])):
                if layer:
                    work = work.child()
                for _ in range(rng.randrange(1, 12)):
                    k = bytes([rng.randrange(40)])
                    if rng.random() < 0.3:
                        work.pop(k, None)
                    else:
                        _ = k in work  # a miss first (cached absent), as a receipt's replay check does
                        work[k] = rng.randrange(1000)
            _same_pairs(work)
            with db.write_batch() as wb:
                work.stage(wb)
            for t in (work, *history):  # written, not settled yet: every state still reads as it did
                _same_pairs(t)
            work.settle()
            head = work
            history.append(head)
            for t in history:
                _same_pairs(t)
        _same_pairs(Table(StoreRoot(db, b"t/", INT, count=None)))
    finally:
        db.close()


def test_pairs_is_items_in_memory_and_ordered_sets_iterate_as_before():
    rng = random.Random(5)
    t: Table = Table.memory({bytes([i]): rng.randrange(100) for i in range(0, 40, 3)})
    for _ in range(12):
        t = t.child()
        for _ in range(5):
            k = bytes([rng.randrange(40)])
            if rng.random() < 0.3:
                t.pop(k, None)
            else:
                t[k] = rng.randrange(1000)
        _same_pairs(t)
        s = OrderedSet(t, lambda: 0)
        assert list(s) == [k for _, k in sorted((v, k) for k, v in t.items())]


# ---------------------------------------------------------------- the explorer index of a block, O(written)

def test_explorer_entries_and_the_head_commit_read_without_a_full_decode_are_as_before(tmp_path, monkeypatch):
    g = make_genesis(committee_size=2, sample_base_ppm=300_000, sample_floor_ppm=300_000, challenge_window=3)
    store = LedgerStore(tmp_path / "db", g)
    state = store.replay()
    rng = random.Random(17)
    voted: set[bytes] = set()
    records: list[bytes] = []
    try:
        for h in range(12):
            txs: list = [make_receipt(g, rng.choice(KEYS[1:5]), height=state.height, rid=rng.randbytes(16))
                         for _ in range(rng.randrange(0, 6))]
            for rid in state.open_receipts:  # votes on some sampled receipts: they become final
                rec = state.receipts[rid]
                if rec.status == SAMPLED and rid not in voted and rng.random() < 0.6:
                    voted.add(rid)
                    txs += [vote(g, rid, k, VALID) for k in KEYS if k.account in rec.committee]
            block, new, rejected = propose(state, txs, VALIDATOR, 1000 + h, store.last_commit())
            assert not rejected, rejected
            fast = index_block(block, state, new)
            with monkeypatch.context() as m:  # every open receipt compared, as before
                m.setattr(explorer_index, "_written_receipts", lambda old, new: None)
                slow = index_block(block, state, new)
            assert fast == slow
            store.append(block, commit_block(VALIDATOR, block), state, new)
            state = new
            whole = store.get_block_raw(store.head)  # the record decoded in full, as last_commit read it before
            assert whole is not None and whole["c"]
            assert store.last_commit() == tuple((bytes(v), int(r), bytes(s)) for v, r, s in whole["c"])
            raw = store.db.get(b"B" + store.head.to_bytes(8, "big"))
            assert blockcodec.record_commit(raw, g.validators) == whole["c"]
            records.append(raw)
        for raw in records:  # damaged records are refused by the skipping reader as by the full decode
            for bad in (raw[:-1], raw + b"\x00", raw[:len(raw) // 2], b"\x95\x03" + raw[2:]):
                with pytest.raises((blockcodec.RecordError, DecodeError)):
                    blockcodec.record_commit(bad, g.validators)
                with pytest.raises((blockcodec.RecordError, DecodeError)):
                    blockcodec._check(unpack_local(bad))  # (the full decode)
        statuses = {r.status for r in state.receipts.values()}
        assert {"valid", "settled"} <= statuses  # receipts were settled and decided while others stayed open
    finally:
        store.close()


# ---------------------------------------------------------------- hashes from prefix states

@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80), st.binary(max_size=80), st.sampled_from(sorted(tree.TAG)))
def test_hashes_from_absorbed_prefixes_are_the_hashes_of_the_concatenations(a, b, table):
    assert smtnode.leaf_hash(a, b) == H(b"\x00", a, H(b))
    assert smtnode.internal_hash(a, b) == H(b"\x01", a, b)  # (jmtnode hashes its nodes with it)
    assert tree.entry_key(table, a) == smtnode.tree_key(tree.TAG[table], a)
    assert tree.leaf_value(a) == H(b"tally/state-entry/v1", a)
    # a prefix state is never changed by use
    assert smtnode.internal_hash(b, a) == H(b"\x01", b, a) and tree.leaf_value(b) == H(b"tally/state-entry/v1", b)
