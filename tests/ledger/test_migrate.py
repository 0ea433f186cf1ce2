"""A store written with the binary node layout (before issue 27) opens with the 16-ary layout, rebuilt once
(node/ledger/statedb.py ``migrate_tree``): the same roots, balances and records, proofs that verify, blocks that
go on, and a crash at any point of the rebuild leaves a store that opens.

The old writer is the old code itself: ``tree.py`` before the change was this module with the binary tree's
``update`` and ``prove`` (node/ledger/core/smt.py, unchanged) and its nodes under ``T/n/``, ``T/x/``, and
``statedb`` wrote no layout key; :func:`_old_code` puts exactly those back for the blocks of the fixture."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from node.encoding import pack
from node.ledger import proofs, statedb
from node.ledger.core import jmt, smt, smtnode, tree as tr
from node.ledger.core.chain import commit_block, propose
from node.ledger.statedb import CODECS, MAPS, SETS
from node.ledger.store import LedgerStore

from .helpers import VALIDATOR, W1, W2, make_genesis, make_receipt

NODES, STALE = tr.NODES, tr.STALE  # the 16-ary layout's prefixes (tr's are patched while the old code runs)


@contextmanager
def _old_code(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(tr, "update", smt.update)
        m.setattr(tr, "prove", smt.prove)
        m.setattr(tr, "NODES", tr.OLD_NODES)
        m.setattr(tr, "STALE", tr.OLD_STALE)
        m.setattr(statedb, "migrate_tree", lambda db: False)
        yield


def _blocks(store, state, g, n):
    for _ in range(n):
        txs = [make_receipt(g, W1 if i % 2 else W2, height=state.height) for i in range(5)]
        block, new, rejected = propose(state, txs, VALIDATOR, 1000 * (state.height + 1), store.last_commit())
        assert not rejected
        store.append(block, commit_block(VALIDATOR, block), state, new)
        state = new
    return state


def _tables(state):
    return {n: dict(state.tables[n].items()) for n in MAPS + SETS}


def _count(db, prefix):
    return sum(1 for _ in db.iterator(prefix=prefix, include_value=False))


def _root_from_entries(state) -> bytes:
    ch = {tr.entry_key(n, k): tr.leaf_value(CODECS[n].dumps(v)) for n in MAPS + SETS
          for k, v in state.tables[n].items()}
    ch[tr.SEQ_KEY] = tr.leaf_value(pack(state.seq))
    return jmt.update(smtnode.MemoryNodeStore(), 0, smtnode.EMPTY_ROOT, ch).root.hash


def _old_store(path, monkeypatch, g, blocks=7):
    """A store written by the old code (binary layout, RETAIN 3 so that it pruned): what it held."""
    monkeypatch.setattr(tr, "RETAIN", 3)
    with _old_code(monkeypatch):
        store = LedgerStore(path, g)
        try:
            state = _blocks(store, store.replay(), g, blocks)
            store.db.delete(tr.LAYOUT_KEY, sync=True)  # (the old code wrote none)
            assert _count(store.db, tr.OLD_NODES) > 0 and _count(store.db, tr.OLD_STALE) > 0
            assert _count(store.db, NODES) == 0
            rid = next(iter(state.receipts))
            # the binary layout reads as the old code read it
            assert smt.get(tr.LevelNodes(store.db), state.tree.root, tr.entry_key("receipts", rid)) is not None
            return {"root": state.tree.root, "parent": store.parent_state.tree.root, "tables": _tables(state),
                    "parent_tables": _tables(store.parent_state), "rid": rid,
                    "old_nodes": _count(store.db, tr.OLD_NODES)}
        finally:
            store.close()


def _check_migrated(path, g, want):
    store = LedgerStore(path, g)
    try:
        state = store.replay()
        db = store.db
        assert db.get(tr.LAYOUT_KEY) == tr.LAYOUT
        assert _count(db, tr.OLD_NODES) == _count(db, tr.OLD_STALE) == _count(db, statedb.SCRATCH) == 0
        assert state.tree.root == want["root"] and store.parent_state.tree.root == want["parent"]
        assert _tables(state) == want["tables"] and _tables(store.parent_state) == want["parent_tables"]
        assert state.account(W1.account).balance == want["tables"]["accounts"][W1.account].balance
        # proofs: the head header commits to the parent state; the head state proves under its own root
        header = store.get_block(store.head)[0].header
        p = proofs.account_proof(store.parent_state, header, W1.account)
        assert proofs.verify_account_proof(p, header, W1.account)["balance"] == \
            want["parent_tables"]["accounts"][W1.account].balance
        k = tr.entry_key("receipts", want["rid"])
        raw = CODECS["receipts"].dumps(want["tables"]["receipts"][want["rid"]])
        assert smt.verify(state.tree.prove(k), state.tree.root.hash, k, tr.leaf_value(raw))
        # blocks go on over the migrated tree, pruning what the migration marked stale
        state = _blocks(store, state, g, 5)
        assert state.state_root() == _root_from_entries(state)
        assert store.verify() == []
    finally:
        store.close()
    again = LedgerStore(path, g)  # and it reopens without rebuilding
    try:
        assert statedb.migrate_tree(again.db) is False
        assert again.replay().tree.root == state.tree.root
    finally:
        again.close()


def test_old_store_opens_migrated_with_the_same_state(tmp_path, monkeypatch):
    g = make_genesis()
    want = _old_store(tmp_path / "db", monkeypatch, g)
    _check_migrated(tmp_path / "db", g, want)


def test_crash_before_the_switch_leaves_the_old_layout_and_the_rebuild_restarts(tmp_path, monkeypatch):
    g = make_genesis()
    want = _old_store(tmp_path / "db", monkeypatch, g)

    def crash(*a, **k):
        raise RuntimeError("power cut")

    with monkeypatch.context() as m:
        m.setattr(statedb.jmt, "update", crash)  # after the parent's nodes are written, before the head's
        store = LedgerStore(tmp_path / "db", g)
        try:
            with pytest.raises(RuntimeError, match="power cut"):
                store.replay()
            assert store.db.get(tr.LAYOUT_KEY) is None and _count(store.db, NODES) > 0
            assert _count(store.db, tr.OLD_NODES) == want["old_nodes"]  # the old layout is whole
        finally:
            store.close()
    _check_migrated(tmp_path / "db", g, want)


def test_crash_during_the_cleanup_is_finished_at_the_next_open(tmp_path, monkeypatch):
    g = make_genesis()
    want = _old_store(tmp_path / "db", monkeypatch, g)
    real = statedb._clear

    def clear(db, prefixes):
        if tr.OLD_NODES in prefixes and db.get(tr.LAYOUT_KEY) == tr.LAYOUT:
            batch = db.write_batch()  # part of the old nodes, then the crash
            for i, k in enumerate(db.iterator(prefix=tr.OLD_NODES, include_value=False)):
                if i % 2:
                    batch.delete(k)
            batch.write()
            raise RuntimeError("power cut")
        real(db, prefixes)

    with monkeypatch.context() as m:
        m.setattr(statedb, "_clear", clear)
        store = LedgerStore(tmp_path / "db", g)
        try:
            with pytest.raises(RuntimeError, match="power cut"):
                store.replay()
            assert 0 < _count(store.db, tr.OLD_NODES) < want["old_nodes"]
        finally:
            store.close()
    _check_migrated(tmp_path / "db", g, want)


def test_damaged_old_store_is_refused_and_left_as_it_was(tmp_path, monkeypatch):
    g = make_genesis()
    want = _old_store(tmp_path / "db", monkeypatch, g)
    store = LedgerStore(tmp_path / "db", g)
    try:
        acc = want["tables"]["accounts"][W1.account]
        store.db.put(statedb.PREFIX["accounts"] + W1.account,
                     CODECS["accounts"].dumps(type(acc)(balance=acc.balance + 1, bond=acc.bond, escrow=acc.escrow,
                                                        nonce=acc.nonce)))
        with pytest.raises(statedb.StateFormatError, match="do not give the stored state root"):
            statedb.migrate_tree(store.db)
        assert store.db.get(tr.LAYOUT_KEY) is None and _count(store.db, tr.OLD_NODES) == want["old_nodes"]
    finally:
        store.close()
