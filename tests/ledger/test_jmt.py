"""The 16-ary (Jellyfish) layout of the state tree (node/ledger/core/jmt.py, issue 27) against the binary tree
(node/ledger/core/smt.py): the same roots and the same proof bytes after any history, exact pruning, fewer and
adjacent node writes, and checked reads."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from node.encoding import H, pack
from node.ledger.core import jmt, jmtnode, smt, smtnode
from node.ledger.core.smt import verify
from node.ledger.core.smtnode import EMPTY_HASH, EMPTY_ROOT, MemoryNodeStore, OverlayNodeStore, Root


def _flip(key: bytes, bit: int) -> bytes:
    return (int.from_bytes(key, "big") ^ (1 << (255 - bit))).to_bytes(32, "big")


_BASE = H(b"base")
# keys sharing long prefixes (chains of nodes, leaves at depth 256, lifts after deletes in and across nibbles)
POOL = [_BASE, _flip(_BASE, 255), _flip(_BASE, 254), _flip(_BASE, 253), _flip(_BASE, 252), _flip(_BASE, 200),
        _flip(_BASE, 7), _flip(_BASE, 3), _flip(_BASE, 0), _flip(_flip(_BASE, 255), 254)] + \
    [H(b"k", bytes([i])) for i in range(30)]
VALUES = st.one_of(st.none(), st.binary(max_size=6))
BATCH = st.dictionaries(st.one_of(st.sampled_from(POOL), st.binary(min_size=32, max_size=32)), VALUES,
                        max_size=12)
HISTORY = st.lists(BATCH, min_size=1, max_size=8)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _run(history):
    """Both trees through ``history`` (versions 1..): their stores, roots after each version, and the model."""
    bs, js = MemoryNodeStore(), MemoryNodeStore()
    broots, jroots, models = [EMPTY_ROOT], [EMPTY_ROOT], [{}]
    for v, batch in enumerate(history, start=1):
        b = smt.update(bs, v, broots[-1], batch)
        j = jmt.update(js, v, jroots[-1], batch)
        bs.commit(b)
        js.commit(j)
        broots.append(b.root)
        jroots.append(j.root)
        m = dict(models[-1])
        for k, val in batch.items():
            if val is None:
                m.pop(k, None)
            else:
                m[k] = val
        models.append(m)
    return bs, js, broots, jroots, models


@FAST
@given(HISTORY)
def test_same_roots_and_proof_bytes_as_the_binary_tree(history):
    bs, js, broots, jroots, models = _run(history)
    assert broots == jroots  # hash and version of every root
    for nk, data in js.nodes.items():  # every internal node stored canonically (patched in place or encoded)
        if data[0] == 1:
            assert jmtnode._encode(*jmtnode._decode(data, nk[:8], nk[8])) == data
    for v, model in enumerate(models):  # every version stays readable before pruning
        for k in set(POOL) | set(model):
            assert jmt.get(js, jroots[v], k) == model.get(k)
            p = jmt.prove(js, jroots[v], k)
            assert p == smt.prove(bs, broots[v], k)
            assert pack(p.to_wire()) == pack(smt.prove(bs, broots[v], k).to_wire())
            assert verify(p, jroots[v].hash, k, model.get(k))
        assert list(jmt.leaves(js, jroots[v])) == sorted(model.items())
        built: dict[bytes, bytes] = {}
        assert jmt.build_sorted(sorted(model.items()), 99, built.__setitem__).hash == jroots[v].hash
        fresh = jmt.update(MemoryNodeStore(), 99, EMPTY_ROOT, model)
        assert fresh.root.hash == jroots[v].hash and fresh.writes == built  # the same nodes, streamed or not


def _reachable(store: MemoryNodeStore, root: Root) -> set[bytes]:
    out: set[bytes] = set()
    todo = [] if root.hash == EMPTY_HASH else [(root.version, 0, 0)]
    while todo:
        version, j, path = todo.pop()
        nk = jmt.node_key(version, j, path)
        data = store.nodes[nk]
        out.add(nk)
        if data[0] == 1:
            _hs, vs, ks = jmtnode._decode(data, nk[:8], j)
            for s in range(16):
                if ks[s]:
                    todo.append((int.from_bytes(vs[s], "big"), j + 1, jmtnode._slot_path(path, j, s)))
    return out


@FAST
@given(HISTORY, st.data())
def test_pruning_keeps_exactly_the_later_versions(history, data):
    _bs, js, _br, roots, models = _run(history)
    keep_from = data.draw(st.integers(min_value=0, max_value=len(history)))
    js.prune(keep_from)
    live: set[bytes] = set()
    for v in range(keep_from, len(history) + 1):
        live |= _reachable(js, roots[v])
        for k in POOL[:10]:
            assert jmt.get(js, roots[v], k) == models[v].get(k)
    assert set(js.nodes) == live


@FAST
@given(HISTORY)
def test_order_of_changes_does_not_matter_and_no_ops_write_nothing(history):
    _bs, js, _br, roots, models = _run(history)
    batch = history[-1]
    a = jmt.update(js, 1000, roots[-2], batch)
    b = jmt.update(js, 1000, roots[-2], dict(reversed(list(batch.items()))))
    assert a == b
    same = {k: v for k, v in models[-1].items()} | {H(b"absent"): None}
    assert jmt.update(js, 1000, roots[-1], same) == (roots[-1], {}, ())
    everything = jmt.update(js, 1000, roots[-1], {k: None for k in models[-1]})
    assert everything.writes == {} and (everything.root.hash == EMPTY_HASH)


def test_fewer_node_writes_and_reads_than_binary():
    rnd = random.Random(7)
    keys = [rnd.randbytes(32) for _ in range(20000)]
    bs, js = MemoryNodeStore(), MemoryNodeStore()
    b = smt.update(bs, 1, EMPTY_ROOT, {k: b"v" for k in keys})
    j = jmt.update(js, 1, EMPTY_ROOT, {k: b"v" for k in keys})
    assert b.root == j.root
    bs.commit(b)
    js.commit(j)
    assert sum(w[0] == 0 for w in j.writes.values()) == len(keys)  # one leaf each, the rest 16-ary nodes
    assert len(j.writes) - len(keys) < (len(b.writes) - len(keys)) / 3  # ~n/3 internal nodes, not ~1.4 n
    for v, key in enumerate(keys[:30], start=2):
        reads: list[bytes] = []

        class Counting:
            def get(self, nk: bytes, _reads=reads) -> bytes | None:
                _reads.append(nk)
                return js.get(nk)

        bu = smt.update(bs, v, b.root, {key: b"new"})
        ju = jmt.update(Counting(), v, j.root, {key: b"new"})
        assert ju.root == bu.root
        assert len(ju.writes) == len(ju.stale) == len(reads) <= 6 < len(bu.writes)  # ~log16(20000) + leaf
        assert {nk[:8] for nk in ju.writes} == {v.to_bytes(8, "big")}  # one version prefix: adjacent keys
        bs.commit(bu)
        js.commit(ju)
        b, j = bu, ju


def test_overlay_and_deep_paths():
    a = _BASE
    pairs = {a: b"x", _flip(a, 255): b"z"}  # differ only in the last bit: 64 nodes deep
    r = jmt.update(MemoryNodeStore(), 1, EMPTY_ROOT, pairs)
    assert r.root == smt.update(MemoryNodeStore(), 1, EMPTY_ROOT, pairs).root
    assert len(r.writes) == 64 + 2
    base = MemoryNodeStore()
    pend = [r]
    r2 = jmt.update(OverlayNodeStore(base, [p.writes for p in pend]), 2, r.root, {a: None})
    assert r2.root == Root(smtnode.leaf_hash(_flip(a, 255), b"z"), 2)  # the survivor lifted to the root
    base.commit(r)
    base.commit(r2)
    p = jmt.prove(base, r.root, a)
    assert len(p.siblings) == 256 and verify(p, r.root.hash, a, b"x")
    base.prune(2)
    assert set(base.nodes) == {jmt.node_key(2, 0, 0)}


def test_missing_and_corrupt_nodes_are_reported():
    store = MemoryNodeStore()
    keys = [H(bytes([i])) for i in range(40)]
    r = jmt.update(store, 1, EMPTY_ROOT, {k: b"v" + k[:2] for k in keys})
    store.commit(r)
    r2 = jmt.update(store, 2, r.root, {keys[0]: b"new"})
    store.commit(r2)
    store.prune(2)
    with pytest.raises(smtnode.MissingNodeError, match="pruned"):
        jmt.get(store, r.root, keys[0])
    with pytest.raises(smtnode.MissingNodeError):
        jmt.update(store, 3, r.root, {keys[1]: b"x"})
    for nk, data in list(store.nodes.items()):
        for bad, what in ((data[:-1] + bytes([data[-1] ^ 1]), smtnode.TreeError), (data[:5], smtnode.CorruptNodeError),
                          (data[:20] + bytes([data[20] ^ 4]) + data[21:], smtnode.CorruptNodeError)):
            store.nodes[nk] = bad
            with pytest.raises(what):
                for k in keys:
                    jmt.get(store, r2.root, k)
                    jmt.prove(store, r2.root, k)
            with pytest.raises(what):
                list(jmt.leaves(store, r2.root))
            with pytest.raises(what):
                jmt.update(store, 3, r2.root, {k: b"w" for k in keys})
        store.nodes[nk] = data
    assert list(jmt.leaves(store, r2.root)) == sorted(({k: b"v" + k[:2] for k in keys} | {keys[0]: b"new"}).items())


def test_bad_input_raises_and_changes_nothing():
    with pytest.raises(ValueError, match="sorted"):
        jmt.build_sorted([(H(b"b"), b"1"), (H(b"a"), b"2")] if H(b"b") > H(b"a") else
                         [(H(b"a"), b"1"), (H(b"b"), b"2")], 1, lambda k, v: None)
    with pytest.raises(ValueError, match="32 bytes"):
        jmt.build_sorted([(b"short", b"1")], 1, lambda k, v: None)
    store = MemoryNodeStore()
    r = jmt.update(store, 1, EMPTY_ROOT, {H(b"a"): b"1"})
    for version, root, changes in ((1, r.root, {H(b"c"): b"x"}), (2, r.root, {b"short": b"x"}),
                                   (2, r.root, {H(b"c"): "text"}), (-1, EMPTY_ROOT, {H(b"c"): b"x"}),
                                   (2, r.root.hash, {H(b"c"): b"x"})):
        with pytest.raises(ValueError):
            jmt.update(store, version, root, changes)
    with pytest.raises(ValueError, match="32 bytes"):
        jmt.prove(store, r.root, b"k")
    assert store.nodes == {}
