"""Sparse Merkle tree benchmark (node/ledger/core/smt.py): cost of a batch of changes and of a proof against n.

For each n (default 10^3, 10^4, 10^5; add 10^6 with ``--sizes``) it builds a tree of n random 32-byte keys with
40-byte values (about an account) in memory, then applies ``--batches`` batches of 100 changes (70 updates, 20
inserts, 10 deletes), each as one version, committed and pruned to the latest version. It prints, per n:

  * node writes and stale nodes per batch, bytes written per batch (node keys + node bytes);
  * median time per batch (``update`` alone, wall clock and this process's CPU time, which other load on a
    shared machine disturbs less; pure Python, one core) and to commit and prune it;
  * proof size (msgpack wire bytes, mean and max over 200 present and 100 absent keys), time to prove, to verify;
  * nodes held after pruning (one version), and their bytes;
  * the ratio of each to the smallest n, which O(log n) per change keeps near log(n)/log(n_min).

Usage: ``.venv/bin/python bench/smt.py [--sizes 1000,10000,100000,1000000] [--batches 20] [--seed 1]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.encoding import pack
from node.ledger.core.smt import get, prove, update, verify
from node.ledger.core.smtnode import EMPTY_ROOT, MemoryNodeStore

VALUE_BYTES = 40


def run_size(n: int, batches: int, rnd: random.Random) -> dict[str, float]:
    """Measure one tree of ``n`` keys; returns the figures printed for it."""
    store = MemoryNodeStore()
    keys = [rnd.randbytes(32) for _ in range(n)]
    t0 = time.perf_counter()
    r = update(store, 1, EMPTY_ROOT, {k: rnd.randbytes(VALUE_BYTES) for k in keys})
    store.commit(r)
    build_s = time.perf_counter() - t0
    root = r.root
    writes, stale, wbytes, t_upd, cpu_upd, t_commit = [], [], [], [], [], []
    for v in range(2, batches + 2):
        picked = rnd.sample(range(len(keys)), 80)
        changes: dict[bytes, bytes | None] = {keys[i]: rnd.randbytes(VALUE_BYTES) for i in picked[:70]}
        changes.update({keys[i]: None for i in picked[70:]})
        fresh = [rnd.randbytes(32) for _ in range(20)]
        changes.update({k: rnd.randbytes(VALUE_BYTES) for k in fresh})
        c0, t0 = time.process_time(), time.perf_counter()
        res = update(store, v, root, changes)
        t1, c1 = time.perf_counter(), time.process_time()
        cpu_upd.append(c1 - c0)
        store.commit(res)
        store.prune(v)
        t_commit.append(time.perf_counter() - t1)
        t_upd.append(t1 - t0)
        writes.append(len(res.writes))
        stale.append(len(res.stale))
        wbytes.append(sum(len(k) + len(x) for k, x in res.writes.items()))
        root = res.root
        for i in sorted(picked[70:], reverse=True):  # swap-remove the deleted keys
            keys[i] = keys[-1]
            keys.pop()
        keys.extend(fresh)
    sizes, t_prove, t_verify = [], [], []
    probe = [(k, True) for k in rnd.sample(keys, min(200, len(keys)))] + [(rnd.randbytes(32), False)
                                                                         for _ in range(100)]
    for k, _ in probe:
        t0 = time.perf_counter()
        p = prove(store, root, k)
        t1 = time.perf_counter()
        value = get(store, root, k)
        t2 = time.perf_counter()
        ok = verify(p, root.hash, k, value)
        t3 = time.perf_counter()
        if not ok:
            raise SystemExit(f"proof failed to verify at n={n}")
        t_prove.append(t1 - t0)
        t_verify.append(t3 - t2)
        sizes.append(len(pack(p.to_wire())))
    return {
        "n": n, "build_s": build_s,
        "writes": statistics.mean(writes), "stale": statistics.mean(stale), "wbytes": statistics.mean(wbytes),
        "batch_ms": 1e3 * statistics.median(t_upd), "batch_cpu_ms": 1e3 * statistics.median(cpu_upd),
        "commit_ms": 1e3 * statistics.median(t_commit),
        "proof_b": statistics.mean(sizes), "proof_max": max(sizes),
        "prove_us": 1e6 * statistics.median(t_prove), "verify_us": 1e6 * statistics.median(t_verify),
        "nodes": len(store.nodes), "node_bytes": sum(len(k) + len(x) for k, x in store.nodes.items()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="comma-separated tree sizes (keys)")
    ap.add_argument("--batches", type=int, default=20, help="batches of 100 changes per size")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    rows = [run_size(int(s), a.batches, rnd) for s in a.sizes.split(",")]
    base = rows[0]
    cols = [("writes", "writes/batch", "{:.0f}"), ("stale", "stale/batch", "{:.0f}"),
            ("wbytes", "B written/batch", "{:.0f}"), ("batch_ms", "ms/batch (wall)", "{:.1f}"),
            ("batch_cpu_ms", "ms/batch (CPU)", "{:.1f}"),
            ("commit_ms", "ms commit+prune", "{:.2f}"), ("proof_b", "proof B (mean)", "{:.0f}"),
            ("proof_max", "proof B (max)", "{:.0f}"), ("prove_us", "µs prove", "{:.0f}"),
            ("verify_us", "µs verify", "{:.0f}"), ("nodes", "nodes held", "{:.0f}"),
            ("node_bytes", "B held", "{:.0f}"), ("build_s", "s to build", "{:.2f}")]
    print(f"{'':18}" + "".join(f"{'n=' + str(r['n']):>22}" for r in rows))
    for key, label, fmt in cols:
        cells = []
        for r in rows:
            ratio = r[key] / base[key] if base[key] else float("nan")
            cells.append(f"{fmt.format(r[key])} ({ratio:.2f}x)")
        print(f"{label:18}" + "".join(f"{c:>22}" for c in cells))
    print(f"(batches of 100 changes: 70 updates, 20 inserts, 10 deletes; values {VALUE_BYTES} B; "
          f"ratios against n={base['n']}; pure Python, in-memory store)")


if __name__ == "__main__":
    main()
