"""Copy-on-write tables (node.ledger.core.kv) against a plain dict model, over a real LevelDB and in memory: reads,
deletes, lengths, sorted iteration; a commit leaves every older state readable exactly as it was; insertion
order of the open sets; the stored state after a commit equals the model."""

from __future__ import annotations

import random

import plyvel
import pytest

from node.ledger.core.kv import Codec, OrderedSet, StoreRoot, Table

INT = Codec(lambda v: v, int)


def _key(rng: random.Random) -> bytes:
    return bytes([rng.randrange(40)])


def _mutate(rng: random.Random, t: Table, model: dict) -> None:
    for _ in range(rng.randrange(1, 12)):
        k = _key(rng)
        if rng.random() < 0.3:
            assert t.pop(k, None) == model.pop(k, None)
        else:
            v = rng.randrange(1000)
            t[k] = v
            model[k] = v


def _same(t: Table, model: dict) -> None:
    assert list(t) == sorted(model) and len(t) == len(model)
    assert dict(t.items()) == model
    for k in (bytes([i]) for i in range(40)):
        assert (k in t) == (k in model) and t.get(k) == model.get(k)


@pytest.mark.parametrize("seed", range(6))
def test_store_tables_commit_like_a_dict_and_old_states_stay_as_they_were(tmp_path, seed):
    rng = random.Random(seed)
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    head = Table(StoreRoot(db, b"t/", INT, cache_items=rng.choice([2, 8, 1000]), count=0))
    model: dict = {}
    history = [(head, dict(model))]  # every committed state with what it must read
    for _ in range(25):
        work = head.child()
        work_model = dict(model)
        _mutate(rng, work, work_model)
        if rng.random() < 0.5:  # a block built in two overlays (a proposal, then the block's own copy)
            work = work.child()
            _mutate(rng, work, work_model)
        _same(work, work_model)
        _same(head, model)  # the working copy never shows through
        if rng.random() < 0.2:
            continue  # a proposal that was never committed
        with db.write_batch() as wb:
            work.stage(wb)
            _same(head, model)  # between stage and settle both read as before
            _same(work, work_model)
        work.settle()
        head, model = work, work_model
        history.append((head, dict(model)))
        for t, m in history:
            _same(t, m)
    fresh = Table(StoreRoot(db, b"t/", INT, count=None))  # the stored table, read back from disk
    _same(fresh, model)
    db.close()


def test_memory_tables_squash_deep_stacks_and_keep_every_copy():
    rng = random.Random(1)
    t, model = Table.memory(), {}
    kept = []
    for _ in range(40):
        t = t.child()
        _mutate(rng, t, model)
        kept.append((t, dict(model)))
    assert t.depth <= 8  # squashed now and then
    for tab, m in kept:
        _same(tab, m)


def test_ordered_sets_keep_insertion_order_like_a_dict():
    n = [0]

    def counter():
        n[0] += 1
        return n[0]

    s = OrderedSet(Table.memory(), counter)
    d: dict = {}
    for k in [b"c", b"a", b"b", b"a", b"d"]:
        s[k] = None
        d[k] = None
    s.pop(b"c")
    d.pop(b"c")
    s[b"c"] = None
    d[b"c"] = None
    assert list(s) == list(d) == [b"a", b"b", b"d", b"c"] and len(s) == 4 and bool(s)
    assert s.pop(b"zz", "none") == "none"


class _CountingReads:
    """A real LevelDB that counts its point reads."""

    def __init__(self, db):
        self.db, self.gets = db, 0

    def get(self, key):
        self.gets += 1
        return self.db.get(key)

    def iterator(self, **kw):
        return self.db.iterator(**kw)


def test_an_empty_stored_table_answers_absent_without_reading_leveldb(tmp_path):
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    reads = _CountingReads(db)
    t = Table(StoreRoot(reads, b"t/", INT, count=0))  # a table nothing was ever stored in (disputes, jobs, ...)
    assert b"x" not in t and t.get(b"y") is None and reads.gets == 0
    work = t.child()
    work[b"x"] = 5
    with db.write_batch() as wb:
        work.stage(wb)
    work.settle()
    assert work.get(b"x") == 5 and b"z" not in work and reads.gets == 1  # stored now: an absent key is read
    work2 = work.child()
    del work2[b"x"]
    with db.write_batch() as wb:
        work2.stage(wb)
    work2.settle()
    assert b"x" not in work2 and b"z" not in work2 and len(work2) == 0 and reads.gets == 1  # empty again
    db.close()
