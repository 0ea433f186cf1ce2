"""Ledger benchmark: receipt throughput against the raw signature-verify rate, and 4-validator finality.

Prints, from one run on this machine:
  * raw pynacl Ed25519 verifications per second on one thread;
  * receipt transactions applied per second through ``apply_block_body`` (the state transition every node runs,
    signature checks included: two per receipt, verified on all cores), and the ratio of the two (target >= 0.5);
  * block finality latency with 4 validators on loopback (real libp2p, gossipsub, LevelDB): for every block at
    every validator, the time from the proposer's header timestamp to the block being stored; median and p95
    (target: median under 1 s).

``--flood N`` instead: the mempool's cost of refusing a gossip flood of N unpayable or far-future transfers from
each of 5 keys (decode, admission checks, refusal; no signature is checked), with and without the per-peer
refusal budget, per transaction.

Usage: ``.venv/bin/python bench/ledger.py [--receipts N] [--heights H] [--flood N]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nacl.signing  # noqa: E402

from node.identity import Identity, dev_seed  # noqa: E402
from node.ledger.genesis import Genesis, Params  # noqa: E402
from node.ledger.state import apply_block_body, genesis_state  # noqa: E402
from node.encoding import pack, unpack  # noqa: E402
from node.ledger.tx import Receipt, decode_tx  # noqa: E402

C = 10**9


def raw_verify_rate(n: int) -> float:
    sk = nacl.signing.SigningKey.generate()
    vk = sk.verify_key
    msgs = [os.urandom(32) for _ in range(n)]
    sigs = [sk.sign(m).signature for m in msgs]
    t0 = time.perf_counter()
    for m, s in zip(msgs, sigs):
        vk.verify(m, s)
    return n / (time.perf_counter() - t0)


def receipt_rate(n: int, per_block: int = 500) -> float:
    workers = [Identity.from_seed(dev_seed(i)) for i in range(1, 5)]
    requesters = [Identity.from_seed(dev_seed(i)) for i in range(10, 30)]
    params = Params(price_per_token_block=1, max_receipt_price=C, sample_base_ppm=1, sample_floor_ppm=1,
                    slash_amount=10**18, challenge_window=10**6)
    g = Genesis("bench", 0, (workers[0].account,),
                tuple([(w.account, 0, 100 * C) for w in workers] + [(r.account, 10**6 * C, 0) for r in requesters]),
                params)
    receipts = []
    for i in range(n):
        w, r = workers[i % len(workers)], requesters[i % len(requesters)]
        rc = Receipt(g.chain_id, os.urandom(16), w.account, r.account, b"m" * 32, 0, 10, 10, os.urandom(32),
                     os.urandom(32), 100, 0)
        receipts.append(rc.sign_worker(w).countersign(r))
    # fresh objects as a node would decode them from a block: no cached ids
    receipts = [decode_tx(unpack(pack(x.to_wire()))) for x in receipts]
    state = genesis_state(g)
    t0 = time.perf_counter()
    for h, i in enumerate(range(0, n, per_block), start=1):
        state = apply_block_body(state, h, os.urandom(32), receipts[i:i + per_block])
    dt = time.perf_counter() - t0
    assert len(state.receipts) == n
    return n / dt


def finality(heights: int) -> list[float]:
    import trio

    from node.compute.model import make_tiny
    from node.runtime import Node, NodeConfig

    keys = [Identity.from_seed(dev_seed(i)) for i in range(4)]
    g = Genesis("tally-test-bench", 0, tuple(k.account for k in keys),
                tuple((k.account, 100 * C, 200 * C) for k in keys), Params(block_time_ms=200))
    latencies: list[float] = []

    async def main(tmp: Path):
        model = make_tiny(tmp / "models", 0)
        async with trio.open_nursery() as n:
            nodes = []
            for i in range(4):
                nd = Node(NodeConfig(data_dir=tmp / f"v{i}", genesis=g, model_dir=model, seed=dev_seed(i),
                                     bootstrap=[a for x in nodes for a in x.host.addrs[:1]]))
                nd.ledger.on_block(lambda b, s: latencies.append(time.time() - b.header.time_ms / 1000))
                nodes.append(nd)
                n.start_soon(nd.run)
                await nd.started.wait()
            start = max(x.ledger.state.height for x in nodes) + 3  # skip start-up heights
            while min(x.ledger.state.height for x in nodes) < start:
                await trio.sleep(0.05)
            latencies.clear()
            while min(x.ledger.state.height for x in nodes) < start + heights:
                await trio.sleep(0.05)
            n.cancel_scope.cancel()

    with tempfile.TemporaryDirectory() as d:
        trio.run(main, Path(d))
    return latencies


def flood_cost(n: int) -> tuple[float, float]:
    """Seconds per flood transaction refused by :class:`~node.ledger.service.LedgerService`'s gossip handler, with
    the default per-peer refusal budget and without one."""
    from dataclasses import replace

    import trio

    from node.ledger.service import LedgerService
    from node.ledger.store import LedgerStore
    from node.ledger.tx import Transfer

    keys = [Identity.from_seed(dev_seed(100 + i)) for i in range(5)]
    val = Identity.from_seed(dev_seed(0))
    g = Genesis("bench-flood", 0, (val.account,), tuple((k.account, C, 0) for k in [val, *keys[1:]]), Params())
    to = Identity.from_seed(dev_seed(1)).account
    msgs = [(pack((Transfer(g.chain_id, k.account, to, 10 * C + i, 0) if i % 2 else
                   Transfer(g.chain_id, k.account, to, 1, 1000 + i)).signed(k).to_wire()), k.peer_id)
            for k in keys for i in range(n)]
    out = []
    with tempfile.TemporaryDirectory() as d:
        store = LedgerStore(Path(d) / "db", g)
        try:
            for budget in (None, 10**9):
                svc = LedgerService(store, g, val, host=None)
                if budget is not None:
                    svc.mempool.limits = replace(svc.mempool.limits, max_refusals_per_peer=budget)

                async def run():
                    for data, peer in msgs:
                        await svc._on_tx_gossip(data, peer)

                t0 = time.perf_counter()
                trio.run(run)
                out.append((time.perf_counter() - t0) / len(msgs))
                assert len(svc.mempool) == 0
        finally:
            store.close()
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--receipts", type=int, default=5000)
    ap.add_argument("--heights", type=int, default=30)
    ap.add_argument("--flood", type=int, default=0, help="only the flood-refusal cost, N transactions per key")
    args = ap.parse_args()
    if args.flood:
        with_budget, without = flood_cost(args.flood)
        print(f"flood refused (5 keys x {args.flood}): {with_budget * 1e6:.0f} us/tx with the per-peer budget, "
              f"{without * 1e6:.0f} us/tx without")
        return
    raw = raw_verify_rate(20_000)
    rate = receipt_rate(args.receipts)
    print(f"raw pynacl verify (1 thread):            {raw:10.0f} /s")
    print(f"receipt txs applied (2 sigs each, {os.cpu_count()} cores): {rate:10.0f} /s")
    print(f"ratio receipts/s ÷ raw verifies/s:       {rate / raw:10.2f}   (target >= 0.5)")
    lat = sorted(finality(args.heights))
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    print(f"finality, 4 validators on loopback ({len(lat)} block commits): median {statistics.median(lat) * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms   (target: median < 1000 ms)")


if __name__ == "__main__":
    main()
