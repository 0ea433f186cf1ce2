"""``bench/ledger.py --network SERVERS --sessions-per-s N``: one validator under a network's settlement traffic
(issue 37, check 1).

A network of SERVERS workers, each serving N sessions a second, settles through tabs and epoch batches
(:mod:`node.ledger.core.tabs`): once per epoch every worker sends one :class:`~node.ledger.core.tabs.EpochBatch`
(the Merkle root over its epoch's receipt ids, their count and work, and the newest voucher of each tab it touched),
reveals the receipts drawn from it with their inclusion proofs, and the drawn receipts' committees vote. Workers'
batches are spread over the epoch's blocks (worker ``i`` sends at block ``i mod epoch_blocks``), so each block
carries ``SERVERS / epoch_blocks`` batches, their reveals and their votes -- exactly what those servers and their
requesters would send (real keys and signatures; each voucher is a co-signed tab receipt).

The validator is this process: each block goes through :func:`node.ledger.core.chain.propose` (every signature
verified once, on every core), :func:`~node.ledger.core.chain.commit_block` and
:meth:`~node.ledger.store.LedgerStore.append` (LevelDB, state tree, fsync). Its time per block is measured and
compared with the block time (500 ms): the validator keeps up when the slowest steady-state block fits it. The
traffic is made outside the timed part (receipt ids, Merkle roots and vouchers before the run; reveals and votes,
which depend on the draws, between blocks).

Parameters: ``genesis/production-params.json`` (its epoch and ``batch_samples``), block time 500 ms. Workers start
with a record of 100 valid verdicts (``--record floor``: the sampling floor, what an established network's workers
have; each batch is drawn ``max(2, m·p/p_base)`` times) or none (``--record new``: ``m`` draws per batch).

Prints: receipts covered per second, ledger transactions per second, state entries written per second, state
bytes per receipt (LevelDB bytes under the state and tree prefixes added during the timed blocks, over the
receipts they covered), raw Ed25519 verifies per second on one thread in the same run, and whether the validator
kept up.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.encoding import inclusion_proof, merkle_root
from node.identity import Identity, dev_seed
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.genesis import Genesis, Params
from node.ledger.core.rows import evolve
from node.ledger.core.tabs import EpochBatch, Reveal, TabOpen, TabReceipt
from node.ledger.core.tabs.rules import epoch_of
from node.ledger.core.tx import VALID, Vote
from node.ledger.statedb import PREFIX
from node.ledger.store import LedgerStore

C = 10**9
ROOT = Path(__file__).resolve().parents[1]
TOKENS, SPAN = 10, 4  # each session: 10 tokens through a 4-block span
WARM = 4  # blocks before the timed ones: batch, draw, reveal, committee -- the pipeline is full from the fifth on


def network_genesis(servers: int, requesters: int) -> tuple[Genesis, Identity, list[Identity], list[Identity]]:
    """The production parameters at 500 ms blocks; ``servers`` bonded workers, ``requesters`` funded accounts."""
    doc = json.loads((ROOT / "genesis" / "production-params.json").read_text())
    p = Params(**{**doc["params"], "block_time_ms": 500})
    p.check()
    val = Identity.from_seed(dev_seed(0))
    workers = [Identity.from_seed(os.urandom(32)) for _ in range(servers)]
    reqs = [Identity.from_seed(os.urandom(32)) for _ in range(requesters)]
    bal = [(val.account, 10**6 * C, p.min_bond)]
    bal += [(w.account, 1000 * C, p.min_bond) for w in workers]
    bal += [(r.account, 10**7 * C, 0) for r in reqs]
    return Genesis("tally-bench-network", 0, (val.account,), tuple(bal), p), val, workers, reqs


class Worker:
    """One server's side: its tabs (one per requester it serves) and its receipts, epoch by epoch."""

    def __init__(self, g: Genesis, me: Identity, tabs: list[tuple[bytes, Identity]], per_epoch: int, touched: int):
        self.g, self.me, self.tabs, self.per_epoch, self.touched = g, me, tabs, per_epoch, touched
        self.nonce = {t: 0 for t, _ in tabs}
        self.starts: dict[int, dict[bytes, int]] = {}  # epoch -> each tab's nonce before it
        self.price = TOKENS * SPAN * g.params.price_per_token_block

    def receipt(self, epoch: int, j: int, tab: bytes, req: Identity, nonce: int) -> TabReceipt:
        sid = (epoch.to_bytes(6, "big") + j.to_bytes(4, "big") + self.me.account[:6])
        return TabReceipt(self.g.domain, sid, self.me.account, req.account, b"m" * 32, 0, SPAN, TOKENS,
                          b"i" * 32, b"o" * 32, tab, nonce, nonce * self.price, 0)

    def epoch_receipts(self, epoch: int) -> list[TabReceipt]:
        """The epoch's receipts in order: spread over ``touched`` of its tabs (rotating per epoch); unsigned."""
        k = len(self.tabs)
        use = [self.tabs[(epoch * self.touched + t) % k] for t in range(self.touched)]
        self.starts[epoch] = {tab: self.nonce[tab] for tab, _ in use}
        out = []
        for j in range(self.per_epoch):
            tab, req = use[j % len(use)]
            self.nonce[tab] += 1
            out.append(self.receipt(epoch, j, tab, req, self.nonce[tab]))
        return out

    def batch(self, epoch: int, rs: list[TabReceipt], reqs: dict[bytes, Identity]) -> EpochBatch:
        newest: dict[bytes, TabReceipt] = {}
        for r in rs:
            newest[r.tab_id] = r
        vouchers = [r.sign_worker(self.me).countersign(reqs[r.requester]).to_record() for r in newest.values()]
        return EpochBatch(self.g.domain, self.me.account, epoch, merkle_root([r.id for r in rs]), len(rs),
                          sum(r.work for r in rs), vouchers).signed(self.me)


def _state_bytes(store: LedgerStore) -> dict[str, int]:
    """Bytes of every key and value per state table (:data:`node.ledger.statedb.PREFIX`) and of the state tree's
    nodes (``tree``: ``T/``, stale versions kept :data:`node.ledger.core.tree.RETAIN` blocks for proofs)."""
    out = {name: sum(len(k) + len(v) for k, v in store.db.iterator(prefix=pre)) for name, pre in PREFIX.items()}
    out["tree"] = sum(len(k) + len(v) for k, v in store.db.iterator(prefix=b"T/"))
    return out


def _block(store: LedgerStore, state, txs, val: Identity, n: int):
    t0 = time.perf_counter()
    blk, new, rejected = propose(state, txs, val, n, store.last_commit())
    store.append(blk, commit_block(val, blk), state, new)
    return new, time.perf_counter() - t0, rejected, blk


def run(servers: int, sessions_per_s: float, blocks: int, tabs_per_server: int, touched: int, record: str) -> dict:
    """Set the network up (untimed), then ``blocks`` timed blocks of its steady traffic; the figures."""
    requesters = max(1, servers * tabs_per_server // 1000)  # each requester holds up to 1000 tabs
    g, val, workers, reqs = network_genesis(servers, requesters)
    p = g.params
    E = p.epoch_blocks
    per_epoch = max(1, round(sessions_per_s * E * p.block_time_ms / 1000))
    by_acct = {r.account: r for r in reqs}
    with tempfile.TemporaryDirectory(prefix="tally-network-") as tmp:
        store = LedgerStore(Path(tmp) / "ledger", g)
        try:
            state, height = store.replay(), 0
            # setup: every tab opened by its requester (untimed), in full blocks
            t_setup = time.perf_counter()
            opens, tabs_of = [], {w.account: [] for w in workers}
            nonces = dict.fromkeys(by_acct, 0)
            for i, w in enumerate(workers):
                for t in range(tabs_per_server):
                    req = reqs[(i * tabs_per_server + t) % requesters]
                    tx = TabOpen(g.domain, req.account, w.account, 10 * C, nonces[req.account]).signed(req)
                    nonces[req.account] += 1
                    opens.append(tx)
                    tabs_of[w.account].append((tx.id, req))
            for i in range(0, len(opens), 2000):
                state, _, rej, _ = _block(store, state, opens[i:i + 2000], val, height)
                height += 1
                assert not rej, rej[:2]
            while height < E:  # into epoch 1, so that every worker has a whole epoch 0 behind it
                state, _, _, _ = _block(store, state, [], val, height)
                height += 1
            if record == "floor":  # an established network: every worker at the sampling floor (bench shortcut)
                for w in workers:
                    state.accounts[w.account] = evolve(state.account(w.account), valid_run=100)
            setup_s = time.perf_counter() - t_setup
            sim = [Worker(g, w, tabs_of[w.account], per_epoch, min(touched, tabs_per_server)) for w in workers]
            # the batches of the run, made before it: worker i sends epoch e's batch at height (e+1)·E + slot(i),
            # slot(i) = floor(i·E / servers): spread evenly, so that any n blocks carry n·servers/E batches (rounded
            # down or up) -- i mod E put 17 batches in some blocks and 16 in others in runs, and a timed window of
            # 30 blocks covered 98,600 receipts/s of the 100,000 offered
            t_gen = time.perf_counter()
            first = height + 1
            plan: dict[int, list[tuple[Worker, EpochBatch, list[bytes]]]] = {}
            slot_of: dict[int, list[int]] = {}
            for i in range(servers):
                slot_of.setdefault(i * E // servers, []).append(i)
            for h in range(first, first + blocks + WARM + 1):  # every block of the run, the timed ones included
                e_now = epoch_of(h, E)
                for i in slot_of.get(h % E, ()):
                    w = sim[i]
                    rs = w.epoch_receipts(e_now - 1)
                    plan.setdefault(h, []).append((w, w.batch(e_now - 1, rs, by_acct), [r.id for r in rs]))
            gen_s = time.perf_counter() - t_gen
            keys = {w.account: w for w in workers} | {val.account: val}
            open_batches: dict[bytes, tuple[Worker, int, list[bytes], int]] = {}
            revealed_at: set[bytes] = set()
            voted: set[tuple[bytes, int]] = set()
            times, txs_n, covered, bytes0 = [], [], [], _state_bytes(store)
            warm = WARM
            for j in range(blocks + warm):
                h = state.height + 1
                txs = []
                for w, b, ids in plan.get(h, []):
                    txs.append(b)
                    open_batches[b.key] = (w, h, ids, b.epoch)
                for key, (w, sent_at, ids, e) in list(open_batches.items()):  # reveal what was drawn
                    st = state.tables["settlements"].get(key)
                    if st is None:
                        if sent_at < h:  # included and already final
                            open_batches.pop(key)
                        continue
                    if st.status.value == "revealing" and key not in revealed_at:
                        revealed_at.add(key)
                        for i in st.draw:
                            r = _regen(w, e, i)
                            r = r.sign_worker(w.me).countersign(by_acct[r.requester])
                            txs.append(Reveal(g.domain, w.me.account, key, i, r.to_record(),
                                              inclusion_proof(ids, i)).signed(w.me))
                    elif st.status.value not in ("revealing", "drawing"):
                        open_batches.pop(key)
                for rid in list(state.open_receipts):  # committees vote
                    rec = state.receipts[rid]
                    if rec.status == "sampled":
                        for m in rec.committee:
                            if (rid, rec.round) + (m,) not in voted and m in keys:
                                voted.add((rid, rec.round) + (m,))
                                txs.append(Vote(g.domain, rid, m, rec.round, VALID, 0).signed(keys[m]))
                state, dt, rej, blk = _block(store, state, txs, val, state.height)
                assert not rej, rej[:3]
                if j >= warm:
                    times.append(dt)
                    txs_n.append(len(blk.txs))
                    covered.append(sum(b.count for _, b, _ in plan.get(h, [])))
                if j == warm - 1:
                    bytes0 = _state_bytes(store)
            bytes1 = _state_bytes(store)
        finally:
            store.close()
    bt = p.block_time_ms / 1000
    wall = len(times) * bt
    grew = {k: bytes1[k] - bytes0.get(k, 0) for k in bytes1}
    n_cov = max(1, sum(covered))
    return {"servers": servers, "sessions_per_s": sessions_per_s, "epoch_blocks": E, "per_batch": per_epoch,
            "m": p.batch_samples, "record": record, "tabs": servers * tabs_per_server, "touched": touched,
            "blocks": len(times), "block_ms": [round(t * 1e3) for t in times],
            "median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3,
            "kept_up": max(times) <= bt, "receipts_per_s": sum(covered) / wall, "txs_per_s": sum(txs_n) / wall,
            "state_bytes_per_receipt": sum(v for k, v in grew.items() if k != "tree") / n_cov,
            "tree_bytes_per_receipt": grew["tree"] / n_cov,
            "by_table": {k: round(v / n_cov, 3) for k, v in sorted(grew.items(), key=lambda kv: -abs(kv[1])) if v},
            "setup_s": setup_s, "gen_s": gen_s}


def _regen(w: Worker, epoch: int, i: int) -> TabReceipt:
    """Receipt ``i`` of ``w``'s batch for ``epoch``, rebuilt as the worker kept it (same fields, same id)."""
    k = len(w.tabs)
    use = [w.tabs[(epoch * w.touched + t) % k] for t in range(w.touched)]
    tab, req = use[i % len(use)]
    return w.receipt(epoch, i, tab, req, w.starts[epoch][tab] + i // len(use) + 1)


__all__ = ["network_genesis", "run"]
