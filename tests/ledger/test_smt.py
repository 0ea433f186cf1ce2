"""The sparse Merkle tree (node/ledger/core/smt.py) against a plain dict model, its proofs, and pruning."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from node.encoding import H, pack, unpack
from node.ledger.core import smt, smtnode
from node.ledger.core.block import Header
from node.ledger.core.smt import MAX_PROOF_BYTES, Proof, prove, update, verify
from node.ledger.core.smtnode import (
    EMPTY_HASH,
    EMPTY_ROOT,
    CorruptNodeError,
    MemoryNodeStore,
    MissingNodeError,
    OverlayNodeStore,
    Root,
    StaleNode,
    internal_hash,
    leaf_hash,
    node_key,
    tree_key,
)
from node.ledger.proofs import verify_state_proof


def _flip(key: bytes, bit: int) -> bytes:
    k = int.from_bytes(key, "big") ^ (1 << (255 - bit))
    return k.to_bytes(32, "big")


_BASE = H(b"base")
# Keys that share long prefixes (down to all but the last bit), so that chains of internal nodes, leaves at
# depth 256 and collapses after deletes all happen; plus ordinary hashed keys.
POOL = [_BASE, _flip(_BASE, 255), _flip(_BASE, 254), _flip(_BASE, 200), _flip(_BASE, 7), _flip(_BASE, 0),
        _flip(_flip(_BASE, 255), 254)] + [H(b"k", bytes([i])) for i in range(25)]
VALUES = st.one_of(st.none(), st.binary(max_size=6))
BATCH = st.dictionaries(st.one_of(st.sampled_from(POOL), st.binary(min_size=32, max_size=32)), VALUES,
                        max_size=10)
HISTORY = st.lists(BATCH, min_size=1, max_size=7)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _apply_model(model: dict[bytes, bytes], batch: dict[bytes, bytes | None]) -> dict[bytes, bytes]:
    out = dict(model)
    for k, v in batch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _run(history: list[dict[bytes, bytes | None]], store: MemoryNodeStore | None = None):
    """Apply ``history`` as versions 1.. to a fresh tree. Returns the store, the root and model after each
    version (index 0: the empty tree)."""
    store = store if store is not None else MemoryNodeStore()
    roots, models = [EMPTY_ROOT], [{}]
    for v, batch in enumerate(history, start=1):
        r = update(store, v, roots[-1], batch)
        store.commit(r)
        roots.append(r.root)
        models.append(_apply_model(models[-1], batch))
    return store, roots, models


def _reachable(store: MemoryNodeStore, root: Root) -> set[bytes]:
    """Node keys of every node of the tree ``root``, by walking the stored bytes."""
    out: set[bytes] = set()
    todo = [] if root.hash == EMPTY_HASH else [(root.version, 0, 0)]
    while todo:
        version, depth, prefix = todo.pop()
        nk = node_key(version, depth, prefix)
        data = store.nodes[nk]
        out.add(nk)
        if data[0] == 1:
            for side, off in ((0, 1), (1, 41)):
                h, v = data[off:off + 32], int.from_bytes(data[off + 32:off + 40], "big")
                if h != EMPTY_HASH:
                    todo.append((v, depth + 1, prefix | (side << (255 - depth))))
    return out


def _check_tree(store: MemoryNodeStore, root: Root, model: dict[bytes, bytes], extra: list[bytes]) -> None:
    for k in set(model) | set(extra):
        want = model.get(k)
        assert smt.get(store, root, k) == want
        p = prove(store, root, k)
        assert verify(p, root.hash, k, want)
        assert verify(p.to_wire(), root.hash, k, want)
        assert verify(unpack(pack(p.to_wire())), root.hash, k, want)
        assert not verify(p, root.hash, k, (want or b"") + b"x")
        if want is not None:
            assert not verify(p, root.hash, k, None)


@FAST
@given(HISTORY)
def test_matches_dict_model_and_every_proof_verifies(history):
    store, roots, models = _run(history)
    for root, model in zip(roots, models, strict=True):  # every version stays readable before pruning
        _check_tree(store, root, model, POOL)


@FAST
@given(HISTORY)
def test_root_depends_only_on_contents(history):
    store, roots, models = _run(history)
    for root, model in zip(roots, models, strict=True):
        fresh = update(MemoryNodeStore(), 0, EMPTY_ROOT, model)
        assert fresh.root.hash == root.hash
    # Within a batch, the order of the changes does not matter: same root, writes and stale nodes.
    base = roots[-2]
    batch = history[-1]
    shuffled = dict(sorted(batch.items(), key=lambda kv: H(kv[0])))
    a = update(store, 1000, base, batch)
    b = update(store, 1000, base, dict(reversed(list(batch.items()))))
    c = update(store, 1000, base, shuffled)
    assert a == b == c


@FAST
@given(HISTORY, st.data())
def test_pruning_keeps_exactly_the_later_versions(history, data):
    store, roots, models = _run(history)
    latest = len(history)
    keep_from = data.draw(st.integers(min_value=0, max_value=latest))
    store.prune(keep_from)
    live: set[bytes] = set()
    for v in range(keep_from, latest + 1):
        live |= _reachable(store, roots[v])
        _check_tree(store, roots[v], models[v], POOL[:8])
    assert set(store.nodes) == live  # nothing a retained version needs is gone, nothing else is left


@FAST
@given(HISTORY)
def test_deleting_everything_returns_the_empty_root(history):
    store, roots, models = _run(history)
    everything = {k: None for k in models[-1]}
    r = update(store, len(history) + 1, roots[-1], everything)
    store.commit(r)
    assert r.root.hash == EMPTY_HASH and r.writes == {}
    store.prune(r.root.version)
    assert store.nodes == {}
    for k in POOL:
        assert smt.get(store, r.root, k) is None
        assert verify(prove(store, r.root, k), EMPTY_HASH, k, None)


def test_known_roots():
    a, b = _BASE, _flip(_BASE, 0)
    store = MemoryNodeStore()
    r1 = update(store, 1, EMPTY_ROOT, {a: b"x"})
    assert r1.root == Root(leaf_hash(a, b"x"), 1) and r1.root.hash == H(b"\x00", a, H(b"x"))
    store.commit(r1)
    r2 = update(store, 2, r1.root, {b: b"y"})
    lo, hi = sorted([(a, b"x"), (b, b"y")])
    assert r2.root.hash == internal_hash(leaf_hash(*lo), leaf_hash(*hi))
    # Two keys that differ only in the last bit: a chain of 255 internal nodes with empty siblings.
    c = _flip(a, 255)
    deep = update(MemoryNodeStore(), 1, EMPTY_ROOT, {a: b"x", c: b"z"})
    pair = sorted([(a, b"x"), (c, b"z")])
    want = internal_hash(leaf_hash(*pair[0]), leaf_hash(*pair[1]))
    for depth in range(254, -1, -1):
        want = internal_hash(EMPTY_HASH, want) if (int.from_bytes(a, "big") >> (255 - depth)) & 1 else \
            internal_hash(want, EMPTY_HASH)
    assert deep.root.hash == want and len(deep.writes) == 256 + 2  # internal nodes at depths 0..255


def test_deepest_proof_fits_the_bound():
    a = _BASE
    c = _flip(a, 255)
    store = MemoryNodeStore()
    r = update(store, 1, EMPTY_ROOT, {a: b"x" * 100, c: b"z"})
    store.commit(r)
    p = prove(store, r.root, a)
    assert len(p.siblings) == 256
    packed = pack(p.to_wire())
    assert len(packed) <= MAX_PROOF_BYTES
    assert verify_state_proof(packed, _header(r.root.hash), a, b"x" * 100)


def _header(state_root: bytes) -> Header:
    return Header("tally-test", 3, H(b"prev"), 0, H(b"proposer"), H(b"txs"), state_root)


def test_one_changed_byte_fails():
    rnd = random.Random(5)
    keys = [H(b"acct", i.to_bytes(4, "big")) for i in range(300)]
    store = MemoryNodeStore()
    r = update(store, 1, EMPTY_ROOT, {k: rnd.randbytes(rnd.randint(1, 20)) for k in keys})
    store.commit(r)
    header = _header(r.root.hash)
    absent = H(b"acct", b"absent")
    for key in (keys[0], keys[17], absent):
        value = smt.get(store, r.root, key)
        packed = pack(prove(store, r.root, key).to_wire())
        assert verify_state_proof(packed, header, key, value)
        for i in range(len(packed)):
            for delta in (1, 0x80):
                bad = bytearray(packed)
                bad[i] ^= delta
                assert not verify_state_proof(bytes(bad), header, key, value), (key.hex(), i, delta)
        for i in range(32):  # and the root in the header, and the key asked about
            assert not verify_state_proof(packed, _header(bytes(x ^ (j == i) for j, x in enumerate(r.root.hash))),
                                          key, value)
            if value is not None:  # (a flipped absent key past the proof's depth is absent on the same path)
                assert not verify_state_proof(packed, header, _flip(key, 8 * i + 3), value)
    # a proof for another block's state does not verify under this header
    r2 = update(store, 2, r.root, {keys[0]: b"changed"})
    store.commit(r2)
    assert not verify_state_proof(pack(prove(store, r2.root, keys[0]).to_wire()), header, keys[0], b"changed")


def test_forged_non_inclusion_fails():
    store = MemoryNodeStore()
    a, b = H(b"a"), H(b"b")
    r = update(store, 1, EMPTY_ROOT, {a: b"1", b: b"2"})
    store.commit(r)
    pa = prove(store, r.root, a)
    assert pa.leaf == (a, H(b"1"))
    assert not verify(pa, r.root.hash, a, None)  # a's own leaf cannot show a absent
    other = next(k for k in (H(bytes([i])) for i in range(256))
                 if (int.from_bytes(k, "big") ^ int.from_bytes(a, "big")) >> 255 == 1)
    assert not verify(pa, r.root.hash, other, None)  # a's leaf is off other's path
    assert not verify(Proof(pa.siblings, None), r.root.hash, a, None)


@pytest.mark.parametrize("wire", [
    None, b"", "proof", 7, {}, [], [[]], [[], None, None], [b"", None], [[b"\x01" * 31], None],
    [[EMPTY_HASH], None], [[b"\x01" * 32] * 257, None], [[], [b"k" * 32]], [[], [b"k" * 32, b"v" * 31]],
    [[], [b"k" * 32, "v" * 32]], [[None], None], [[[b"\x01" * 32]], None], [[True], None],
])
def test_malformed_wire_proofs_return_false(wire):
    store = MemoryNodeStore()
    k = H(b"k")
    r = update(store, 1, EMPTY_ROOT, {k: b"v"})
    for root in (r.root.hash, EMPTY_HASH):
        for value in (None, b"v"):
            assert verify(wire, root, k, value) is False
            assert verify_state_proof(wire, _header(root), k, value) is False
    with pytest.raises(smt.ProofError):
        Proof.from_wire(wire)


def test_bad_arguments_to_verify_return_false():
    store = MemoryNodeStore()
    k = H(b"k")
    r = update(store, 1, EMPTY_ROOT, {k: b"v"})
    store.commit(r)
    p = prove(store, r.root, k)
    assert verify(p, r.root.hash, k, b"v")
    for root, key, value in ((r.root.hash[:31], k, b"v"), (None, k, b"v"), (r.root.hash, k[:31], b"v"),
                             (r.root.hash, "k", b"v"), (r.root.hash, k, "v"), (r.root, k, b"v")):
        assert verify(p, root, key, value) is False
    assert verify_state_proof(pack(p.to_wire()), "not a header", k, b"v") is False
    assert verify_state_proof(b"\xc1" * 10, _header(r.root.hash), k, b"v") is False
    assert verify_state_proof(b"\x00" * (MAX_PROOF_BYTES + 1), _header(r.root.hash), k, b"v") is False


def test_writes_are_one_path_per_change():
    rnd = random.Random(3)
    keys = [rnd.randbytes(32) for _ in range(2000)]
    store = MemoryNodeStore()
    r = update(store, 1, EMPTY_ROOT, {k: b"v" for k in keys})
    store.commit(r)
    assert sum(w[0] == 0 for w in r.writes.values()) == len(keys)  # one leaf per key, the rest internal
    for version, key in enumerate(keys[:20], start=2):
        depth = len(prove(store, r.root, key).siblings)
        u = update(store, version, r.root, {key: b"new"})
        assert len(u.writes) == depth + 1 and len(u.stale) == depth + 1  # the path, rewritten
        assert {s.since for s in u.stale} == {version}
        store.commit(u)
        r = u


def test_no_op_batches_write_nothing():
    store, roots, _ = _run([{H(b"a"): b"1", H(b"b"): b"2"}])
    for batch in ({}, {H(b"a"): b"1"}, {H(b"zz"): None}, {H(b"a"): b"1", H(b"zz"): None}):
        r = update(store, 9, roots[-1], batch)
        assert r == (roots[-1], {}, ())
    r = update(MemoryNodeStore(), 4, EMPTY_ROOT, {H(b"zz"): None})
    assert r == (EMPTY_ROOT, {}, ())


def test_no_op_changes_beside_real_ones_write_nothing_more():
    rnd = random.Random(4)
    model = {rnd.randbytes(32): rnd.randbytes(4) for _ in range(500)}
    store = MemoryNodeStore()
    r = update(store, 1, EMPTY_ROOT, model)
    store.commit(r)
    keys = sorted(model)
    real = {keys[0]: b"new", keys[-1]: None}
    no_ops = {k: model[k] for k in keys[100:400:7]} | {rnd.randbytes(32): None for _ in range(30)}
    assert update(store, 2, r.root, real | no_ops) == update(store, 2, r.root, real)


def test_bad_input_raises_and_changes_nothing():
    store, roots, _ = _run([{H(b"a"): b"1"}, {H(b"b"): b"2"}])
    before = dict(store.nodes)
    root = roots[-1]
    for version, r, changes, match in (
        (3, root, {b"short": b"x"}, "32 bytes"),
        (3, root, {H(b"c"): "text"}, "bytes, or None"),
        (3, root, {H(b"c"): 5}, "bytes, or None"),
        (2, root, {H(b"c"): b"x"}, "greater than"),
        (1, root, {H(b"c"): b"x"}, "greater than"),
        (-1, EMPTY_ROOT, {H(b"c"): b"x"}, "version must"),
        (True, EMPTY_ROOT, {H(b"c"): b"x"}, "version must"),
        (1 << 64, EMPTY_ROOT, {H(b"c"): b"x"}, "version must"),
        (3, root.hash, {H(b"c"): b"x"}, "Root"),
    ):
        with pytest.raises(ValueError, match=match):
            update(store, version, r, changes)
    with pytest.raises(ValueError, match="32 bytes"):
        smt.get(store, root, b"short")
    with pytest.raises(ValueError, match="32 bytes"):
        prove(store, root, H(b"a")[:5])
    assert store.nodes == before


def test_missing_and_corrupt_nodes_are_reported():
    store, roots, _ = _run([{H(b"a"): b"1", H(b"b"): b"2"}, {H(b"a"): b"3"}])
    store.prune(2)
    with pytest.raises(MissingNodeError, match="pruned"):
        smt.get(store, roots[1], H(b"a"))
    with pytest.raises(MissingNodeError):
        update(store, 3, roots[1], {H(b"c"): b"x"})
    assert smt.get(store, roots[2], H(b"a")) == b"3"
    for nk, data in list(store.nodes.items()):
        store.nodes[nk] = data[:1] + bytes([data[1] ^ 1]) + data[2:]  # a hash (internal) or the key (leaf)
        with pytest.raises(CorruptNodeError, match="does not match its hash"):
            for k in (H(b"a"), H(b"b")):
                smt.get(store, roots[2], k)
        # the last byte: a leaf's value (its hash no longer matches) or a child's version (the child is sought
        # at a version that has no node there)
        store.nodes[nk] = data[:-1] + bytes([data[-1] ^ 1])
        with pytest.raises(smtnode.TreeError):
            for k in (H(b"a"), H(b"b")):
                smt.get(store, roots[2], k)
        store.nodes[nk] = data[:5]
        with pytest.raises(CorruptNodeError, match="malformed"):
            for k in (H(b"a"), H(b"b")):
                prove(store, roots[2], k)
        store.nodes[nk] = data


def test_overlay_builds_on_uncommitted_writes():
    batches = [{H(bytes([i])): bytes([i])} for i in range(5)] + [{H(bytes([1])): None, H(bytes([9])): b"9"}]
    committed, roots, _ = _run(batches)
    base = MemoryNodeStore()
    root, pending = EMPTY_ROOT, []
    for v, batch in enumerate(batches, start=1):
        r = update(OverlayNodeStore(base, [p.writes for p in pending]), v, root, batch)
        pending.append(r)
        root = r.root
    assert root == roots[-1] and base.nodes == {}
    for p in pending:
        base.commit(p)
    assert base.nodes == committed.nodes and base.stale == committed.stale


def test_encodings_roundtrip_and_keys():
    r = Root(H(b"r"), 12345)
    assert Root.from_bytes(r.to_bytes()) == r and len(r.to_bytes()) == 40
    with pytest.raises(ValueError):
        Root.from_bytes(b"\x00" * 39)
    s = StaleNode(7, node_key(3, 9, H(b"x")))
    assert StaleNode.from_index_key(s.index_key()) == s
    assert s.index_key() < smtnode.prune_bound(7) <= StaleNode(8, s.node_key).index_key()
    assert len(node_key(1, 0, H(b"x"))) == 10 and len(node_key(1, 256, H(b"x"))) == 42
    assert node_key(1, 3, b"\xff" * 32) == node_key(1, 3, b"\xe0" + b"\x00" * 31)
    assert tree_key(b"ab", b"c") != tree_key(b"a", b"bc") and len(tree_key(b"acct", b"x")) == 32
    with pytest.raises(ValueError):
        tree_key(b"", b"x")
    with pytest.raises(TypeError):
        tree_key("acct", b"x")
