"""The receipt hot path of the ledger (issue 27): the faster forms give exactly the results of the plain ones.

* The state tree's decoded-node cache (node/ledger/core/jmtnode.py) holds packed bytes that the cyclic garbage
  collector stops tracking, and an update read through a warm cache writes exactly what a cold one writes.
"""

from __future__ import annotations

import gc
import random

from node.encoding import H
from node.ledger.core import jmt, jmtnode
from node.ledger.core.smt import EMPTY_ROOT, MemoryNodeStore


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
