"""State sync against replay (issue 13, check 3): the time for a new node to reach the head state from a snapshot
(make, check every chunk, rebuild and check the state root, install) beside replaying every block from genesis
(signatures, commits, the state transition), on the same chain of real signed receipts, in one run.

Usage: ``.venv/bin/python bench/statesync.py [--receipts N] [--per-block K]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.identity import Identity, dev_seed
from node.ledger import snapshot as snap
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.tx import Receipt
from node.ledger.genesis import Genesis, Params
from node.ledger.store import LedgerStore

C = 10**9


def build(path: Path, n: int, per_block: int) -> tuple[Genesis, float]:
    """A chain with ``n`` receipts in blocks of ``per_block``; returns the genesis and the seconds it took."""
    val = Identity.from_seed(dev_seed(0))
    workers = [Identity.from_seed(dev_seed(i)) for i in range(1, 5)]
    reqs = [Identity.from_seed(dev_seed(i)) for i in range(10, 30)]
    params = Params(price_per_token_block=1, max_receipt_price=C, sample_base_ppm=1, sample_floor_ppm=1,
                    challenge_window=4, receipt_max_age=10**6)
    g = Genesis("bench-sync", 0, (val.account,),
                tuple([(val.account, 0, 100 * C)] + [(w.account, 0, 100 * C) for w in workers]
                      + [(r.account, 10**6 * C, 0) for r in reqs]), params)
    store = LedgerStore(path, g)
    state = store.replay()
    t0 = time.perf_counter()
    for start in range(0, n, per_block):
        txs = []
        for i in range(start, min(n, start + per_block)):
            w, r = workers[i % len(workers)], reqs[i % len(reqs)]
            rc = Receipt(g.domain, os.urandom(16), w.account, r.account, b"m" * 32, 0, 10, 10,
                         os.urandom(32), os.urandom(32), 100, state.height)
            txs.append(rc.sign_worker(w).countersign(r))
        block, new, rej = propose(state, txs, val, 1000 + state.height, store.last_commit())
        assert not rej, rej[:1]
        store.append(block, commit_block(val, block), state, new)
        state = new
    for _ in range(6):  # settle the last receipts, then one block that certifies the snapshot's state
        block, new, _ = propose(state, [], val, 1000 + state.height, store.last_commit())
        store.append(block, commit_block(val, block), state, new)
        state = new
    store.close()
    return g, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--receipts", type=int, default=100_000,
                    help="receipts in the chain (default %(default)s: issue 13, check 3)")
    ap.add_argument("--per-block", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        g, built = build(src, args.receipts, args.per_block)
        store = LedgerStore(src, g)
        head = store.head
        t0 = time.perf_counter()
        diffs = store.verify()
        replay_s = time.perf_counter() - t0
        assert diffs == [], diffs
        store.close()
        store = LedgerStore(src, g)
        t0 = time.perf_counter()
        # (a served snapshot is made once by the source; what a new node pays is the checks and the install)
        manifest, chunks = snap.make(store.db, g.domain)
        make_s = time.perf_counter() - t0
        dst = LedgerStore(Path(tmp) / "dst", g)
        # the snapshot is of the head state: the source's next block certifies it, as a peer would serve it
        state = store.replay()
        val = Identity.from_seed(dev_seed(0))
        nb, _new, _ = propose(state, [], val, 10**9, store.last_commit())
        ncommit = commit_block(val, nb)
        t0 = time.perf_counter()
        synced = snap.restore(dst, manifest, [chunks[c] for c in manifest.chunks], nb.header, ncommit,
                              g.validators)
        sync_s = time.perf_counter() - t0
        assert synced.state_root() == state.state_root()
        size = sum(len(c) for c in chunks.values())
        items = sum(manifest.counts)
        print(f"chain: {head} blocks, {args.receipts} receipts ({built:.1f} s to build)")
        print(f"replay from genesis (node ledger verify):   {replay_s:8.2f} s")
        print(f"state sync (check chunks, rebuild root, install): {sync_s:8.2f} s   "
              f"(+ {make_s:.2f} s for the source to make the snapshot)")
        print(f"snapshot: {len(manifest.chunks)} chunks, {size} bytes, {size / max(1, items):.0f} B per live item")
        print(f"ratio state sync / replay: {sync_s / replay_s:.3f}   (target < 0.1)")
        dst.close()
        store.close()


if __name__ == "__main__":
    main()
