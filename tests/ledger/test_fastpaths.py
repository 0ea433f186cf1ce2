"""Issue 27's fast paths give the same bytes, states and roots as the slow ones they replace: the trusted decode of
the node's own LevelDB, the precomputed record encoders, the encoded bytes reused by the commit, one signature
check per transaction when proposing, the recent tree nodes held in memory, and the receipt-rate bench."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import plyvel
import pytest

from node.encoding import DecodeError, pack, unpack, unpack_local
from node.ledger.core import state as state_mod, tree as tr
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.records import CODECS, MAPS, SETS, ReceiptRecord, from_plain, to_plain
from node.ledger.core.state import apply_block_body, genesis_state
from node.ledger.core.status import SETTLED
from node.ledger.core.tx import Transfer, Tx, decode_tx
from node.ledger.statedb import PREFIX
from node.ledger.store import LedgerStore

from .helpers import KEYS, VALIDATOR, W1, W2, make_genesis, make_receipt, vote

ROOT = Path(__file__).resolve().parents[2]


def _old_to_plain(v):
    """The reflection-based encoder that records.to_plain replaced (the reference)."""
    if isinstance(v, Tx):
        return v.to_wire()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [_old_to_plain(getattr(v, f.name)) for f in dataclasses.fields(v)]
    if isinstance(v, (tuple, list)):
        return [_old_to_plain(x) for x in v]
    return v


def _wire(tx: Tx):
    """A transaction as a node gets it from a block: decoded from bytes (no cached id)."""
    return decode_tx(unpack(pack(tx.to_wire())))


def test_unpack_local_equals_unpack_and_refuses_damaged_bytes():
    objs = [0, -5, 2**63, "", "ü" * 40, b"\x00" * 70, [1, [2, [3, None]]], {"a": [b"x", True], "b": {}},
            [{"t": "receipt", "f": [b"k" * 32] * 12, "s": [b"s" * 64] * 2}, 7, "pending", [], []]]
    for o in objs:
        raw = pack(o)
        assert unpack_local(raw) == unpack(raw) == o
    raw = pack([1, 2, 3])
    for bad in (raw[:-1], raw + b"\x00", b"\xc1", b""):  # truncated, trailing byte, unused type byte, nothing
        with pytest.raises(DecodeError):
            unpack_local(bad)


def test_record_encoders_equal_the_reflection_based_ones():
    g = make_genesis()
    r = make_receipt(g, W1)
    recs = [ReceiptRecord(receipt=r, height=3),
            ReceiptRecord(receipt=r, height=9, status=SETTLED, p_ppm=10_000, round=1, round_height=7,
                          committee=(W2.account, KEYS[5].account), votes=((W2.account, 1, 0, 12),),
                          final_height=12, payouts=((W1.account, 90), (W2.account, 10)), slashed=3)]
    codec = CODECS["receipts"]
    for rec in recs:
        plain = to_plain(rec)
        assert plain == _old_to_plain(rec)
        raw = codec.dumps(rec)
        assert raw == pack(_old_to_plain(rec))
        assert codec.loads(raw) == codec.loads_local(raw) == rec
        assert from_plain(plain, ReceiptRecord, trusted=True) == from_plain(plain, ReceiptRecord) == rec
    for tx in (r, Transfer(r.chain_id, KEYS[0].account, W1.account, 5, 2).signed(KEYS[0]), vote(g, r.id, W2, 0)):
        assert to_plain(tx) == tx.to_wire()
    with pytest.raises(ValueError):  # shapes are checked on the trusted path too
        from_plain(to_plain(recs[0])[:-1], ReceiptRecord, trusted=True)
    with pytest.raises(ValueError):
        from_plain([{"t": "nope", "f": [], "s": []}, *to_plain(recs[0])[1:]], ReceiptRecord, trusted=True)


def _receipts(g, n: int, height: int = 0):
    workers = [KEYS[i] for i in (1, 2, 3, 4)]
    return [_wire(make_receipt(g, workers[i % 4], KEYS[0], height=height)) for i in range(n)]


def _count_verifies(monkeypatch) -> list[int]:
    calls = [0]
    real = state_mod.verify_many

    def counting(items):
        calls[0] += len(items)
        return real(items)

    monkeypatch.setattr(state_mod, "verify_many", counting)
    return calls


@pytest.mark.parametrize("with_bad", [False, True])
def test_propose_checks_each_signature_once_and_equals_a_validators_state(monkeypatch, with_bad):
    g = make_genesis()
    s0 = genesis_state(g)
    txs = _receipts(g, 80)
    if with_bad:  # a receipt whose requester signature is another key's: rejected, the block re-applied
        bad = make_receipt(g, W1, KEYS[0], sign=False)
        txs.insert(40, _wire(dataclasses.replace(bad.sign_worker(W1), requester_sig=KEYS[6].sign(bad.id))))
    calls = _count_verifies(monkeypatch)
    block, new, rejected = propose(s0, txs, VALIDATOR, 1000, ())
    assert calls[0] == 2 * len(txs)  # two signatures per receipt, each verified once
    assert len(rejected) == (1 if with_bad else 0) and len(block.txs) == 80
    fresh = [_wire(tx) for tx in block.txs]  # what another validator applies, verifying everything itself
    other = apply_block_body(s0, 1, block.hash, fresh)
    assert new.state_root() == other.state_root() and new.height == other.height == 1
    assert new.last_hash == other.last_hash == block.hash
    for name in MAPS + SETS:
        assert dict(new.tables[name].items()) == dict(other.tables[name].items()), name


def test_commit_writes_the_bytes_the_root_hashed_and_cached_nodes_are_the_stored_ones(tmp_path):
    g = make_genesis(challenge_window=2)
    store = LedgerStore(tmp_path / "db", g)
    try:
        state = store.replay()
        for h in range(1, 7):
            txs = _receipts(g, 30, height=state.height)
            block, new, rejected = propose(state, txs, VALIDATOR, 1000 * h, store.last_commit())
            assert not rejected
            new.state_root()  # as the commit does first: encodes this block's writes once
            encoded = {n: dict(m) for n, m in (new.encoded or {}).items()}
            new_nodes = list(new.tree.pending)  # committed below: held in memory afterwards
            store.append(block, commit_block(VALIDATOR, block), state, new)
            state = new
            assert state.encoded is None  # dropped once committed
            assert encoded  # state_root() encoded this block's writes ...
            for name, rows in encoded.items():  # ... and the commit stored exactly those bytes
                for k, raw in rows.items():
                    assert store.db.get(PREFIX[name] + k) == raw == CODECS[name].dumps(state.tables[name][k])
            base = state.tree.base
            assert isinstance(base, tr.LevelNodes) and 0 < len(base.cache) <= 2 * base.cache.limit
            for nk, raw in base.cache.items():  # every node held in memory is the stored one
                assert store.db.get(tr.NODES + nk) == raw
            assert all(nk in base.cache.hot or nk in base.cache.cold for nk in new_nodes)
        root = state.state_root()
    finally:
        store.close()
    reopened = LedgerStore(tmp_path / "db", g)  # a fresh process reads every node from LevelDB: the same root
    try:
        again = reopened.replay()
        assert again.state_root() == root and not len(again.tree.base.cache)
        assert len(again.receipts) == 6 * 30
        assert reopened.verify() == []
    finally:
        reopened.close()


def test_rate_bench_prints_both_sizes(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import ledger_rate
    import ledger_scale

    ledger_scale.build(tmp_path / "ledger-10000", 300)  # named as the bench looks them up; small, for speed
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "ledger_rate.py"), "--store-dir", str(tmp_path),
                        "--rate-blocks", "2", "--rate-per-block", "40", "--profile"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("raw pynacl verify (1 thread):")
    assert "at 10^4 live receipts (300 held):" in lines[1] and "ratio" in lines[1]
    # where the block's time went: every phase named, each a number of milliseconds, the tree inside the state root
    assert lines[2].startswith("  where a block's ")
    phases = dict(p.rsplit(" ", 1) for p in lines[2].split("(mean, wall ms): ")[1].split(", "))
    assert set(phases) == {*ledger_rate.PHASES, "the rest"}
    ms = {k: float(v) for k, v in phases.items()}
    assert ms["signatures"] > 0 and ms["state root"] > 0 and ms["write + fsync"] > 0
    assert 0 < ms["of which tree"] <= ms["state root"]
    assert "at 10^6 live receipts: not measured" in lines[3] and "--scale" in lines[3]
    assert "slowest of 2 blocks of 40 receipts" in r.stderr
    held = plyvel.DB(str(tmp_path / "ledger-10000"))
    try:  # measured on a copy: the kept store is as built
        assert sum(1 for _ in held.iterator(prefix=b"S/r/", include_value=False)) == 300
    finally:
        held.close()


def test_msgpack_default_limits_do_not_bind_local_reads():
    big = [b"x"] * (1 << 17)  # more items than unpack's max_array_len for peer bytes
    raw = pack(big)
    assert unpack_local(raw) == big
    with pytest.raises(DecodeError):
        unpack(raw)


def test_block_work_runs_with_the_cyclic_collector_paused_and_restored(tmp_path):
    import gc

    from node.ledger.core.chain import paused_gc

    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # re-entrant: the inner one leaves it paused
            pass
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()  # restored, even after an exception
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()

    g = make_genesis(challenge_window=2)
    store = LedgerStore(tmp_path / "db", g)
    passes: list[int] = []

    def count(phase, info):
        if phase == "start":
            passes.append(info["generation"])

    try:
        state = store.replay()
        txs = _receipts(g, 300, height=state.height)
        gc.collect()
        gc.callbacks.append(count)
        try:
            block, new, rejected = propose(state, txs, VALIDATOR, 1000, store.last_commit())
            store.append(block, commit_block(VALIDATOR, block), state, new)
        finally:
            gc.callbacks.remove(count)
        assert not rejected and store.head == 1
        # ~10^5 objects made: no collector pass while the block was built, nor while it was stored; one young pass
        # after each (dozens of passes, some older, without the pause)
        assert len(passes) <= 2 and set(passes) <= {0}, passes
        assert gc.isenabled()
    finally:
        store.close()


def test_stores_with_snappy_tables_and_without_read_each_other(tmp_path):
    """LedgerStore writes tables uncompressed (store.COMPRESSION); a store whose tables were written with Snappy
    (every store before issue 27) opens with the same state and verifies, and an older reader (LevelDB's default
    options) reads what it writes now."""
    g = make_genesis(challenge_window=2)
    path = tmp_path / "db"

    def grow(store, state, blocks):
        for _ in range(blocks):
            h = state.height + 1
            block, new, rejected = propose(state, _receipts(g, 20, height=state.height), VALIDATOR, 1000 * h,
                                           store.last_commit())
            assert not rejected
            store.append(block, commit_block(VALIDATOR, block), state, new)
            state = new
        return state

    def compact_as(compression):  # rewrite every table with ``compression``, as an older node would have
        db = plyvel.DB(str(path), compression=compression)
        db.compact_range(start=b"\x00", stop=b"\xff" * 40)
        db.close()

    store = LedgerStore(path, g)
    state = grow(store, store.replay(), 4)
    root, accounts, n = state.state_root(), dict(state.accounts.items()), len(state.receipts)
    store.close()
    compact_as("snappy")
    store = LedgerStore(path, g)
    try:
        again = store.replay()
        assert again.state_root() == root and dict(again.accounts.items()) == accounts and len(again.receipts) == n
        assert store.verify() == []
        state = grow(store, again, 3)  # written uncompressed beside the Snappy tables
        root = state.state_root()
    finally:
        store.close()
    compact_as("snappy")  # an older node's LevelDB reads and rewrites the mixed store
    store = LedgerStore(path, g)
    try:
        assert store.replay().state_root() == root and store.verify() == []
    finally:
        store.close()
