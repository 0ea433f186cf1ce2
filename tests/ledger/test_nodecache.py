"""The state tree's node cache (node/ledger/core/tree.py ``NodeCache``, issue 27): bounded, never holding a node
that differs from the stored one, and forgetting the nodes pruning deletes (a pruned version stays unreadable)."""

from __future__ import annotations

import pytest

from node.ledger.core import jmt, smtnode, tree as tr
from node.ledger.core.chain import commit_block, propose
from node.ledger.store import LedgerStore

from .helpers import VALIDATOR, W1, W2, make_genesis, make_receipt


def test_cache_is_bounded_and_keeps_what_is_used():
    c = tr.NodeCache(limit=8)
    for i in range(100):
        c.put(bytes([i]), b"n%d" % i)
        assert len(c.hot) < 8 and len(c.cold) <= 8
        if i >= 1:
            assert c.get(b"\x01") == b"n1"  # used all along: moved to the newer generation, never forgotten
    assert len(c) <= 16 and c.get(b"\x02") is None  # used once, long ago: forgotten
    c.add({bytes([200 + i]): b"w" for i in range(9)})  # more than a generation at once: not held
    assert all(c.get(bytes([200 + i])) is None for i in range(9))
    c.add({b"\xff": b"w"})
    c.drop(b"\xff")
    c.drop(b"\x01")
    assert c.get(b"\xff") is None and c.get(b"\x01") is None


def test_pruned_nodes_leave_the_cache_and_cached_nodes_are_the_stored_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "RETAIN", 2)  # versions (blocks) kept provable: prune from block 3 on
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    try:
        state = store.replay()
        roots = []
        for h in range(1, 9):
            txs = [make_receipt(g, W1 if i % 2 else W2, height=state.height) for i in range(6)]
            block, new, rejected = propose(state, txs, VALIDATOR, 1000 * h, store.last_commit())
            assert not rejected
            store.append(block, commit_block(VALIDATOR, block), state, new)
            state = new
            roots.append(state.tree.root)
            cache = state.tree.base.cache
            assert len(cache) > 0
            for nk, raw in cache.items():  # nothing pruned is held, and nothing held differs from the store
                assert store.db.get(tr.NODES + nk) == raw
        assert roots[-1] == state.tree.root
        nodes = tr.LevelNodes(store.db, state.tree.base.cache)  # the node's own reader, its cache included
        assert jmt.get(nodes, roots[-1], smtnode.tree_key(b"x", b"absent")) is None
        with pytest.raises(smtnode.MissingNodeError):  # pruned (stale for more than RETAIN versions): unreadable
            jmt.prove(nodes, roots[0], smtnode.tree_key(b"x", b"absent"))
    finally:
        store.close()
