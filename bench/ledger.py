"""Ledger benchmark: receipt throughput against the raw signature-verify rate, and 4-validator finality.

Prints, from one run on this machine:
  * raw pynacl Ed25519 verifications per second on one thread;
  * receipt transactions applied per second through ``apply_block_body`` (the state transition every node runs,
    signature checks included: two per receipt, verified on all cores), and the ratio of the two (target >= 0.5);
  * block finality latency with 4 validators on loopback (real libp2p, gossipsub, LevelDB): for every block at
    every validator, the time from the proposer's header timestamp to the block being stored; median and p95
    (target: median under 1 s).

``--idle SECONDS`` instead: what an idle chain costs (one validator on loopback, block time 200 ms): the bytes an
empty block adds to LevelDB (every key and value it adds or changes, explorer index and state included; the
stored form, :mod:`node.ledger.core.blockcodec`, beside the whole wire form stored before) and the blocks made per idle
minute, watched for SECONDS with ``--heartbeat-ms`` (default 2000) and with heartbeat = block time (today's
behaviour, ``heartbeat_ms`` 0), in the same run.

``--flood N`` instead: the mempool's cost of refusing a gossip flood of N unpayable or far-future transfers from
each of 5 keys (decode, admission checks, refusal; no signature is checked), with and without the per-peer
refusal budget, per transaction.

``--rate`` instead: only the receipt rate through a validator holding 10^4 and 10^6 live receipts (the 10^6 store
from ``--scale --keep DIR``, given as ``--store-dir DIR``), against the raw verify rate, side by side in one run
(:mod:`ledger_rate`, bench/ledger_rate.py; ``--profile``: the slowest block of each size). The default run prints
these lines too.

``--scale`` instead: the ledger holding 10^4, 10^5 and 10^6 receipts (``--sizes`` to change), each size in fresh
subprocesses: start time, resident memory, time per empty block and per block of 100 receipts, stored bytes per live
state item and per empty block, against issue 13's targets (:mod:`ledger_scale`, bench/ledger_scale.py).

Usage: ``.venv/bin/python bench/ledger.py [--receipts N] [--heights H] [--flood N] [--idle S [--heartbeat-ms MS]]
[--scale [--sizes N,N,...] [--timeout S]]``
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

import ledger_network
import ledger_rate
import ledger_scale
import nacl.signing

from node.encoding import pack, unpack
from node.identity import Identity, dev_seed
from node.ledger.core.state import apply_block_body, genesis_state
from node.ledger.core.tx import Receipt, decode_tx
from node.ledger.genesis import Genesis, Params

C = 10**9


def raw_verify_rate(n: int) -> float:
    sk = nacl.signing.SigningKey.generate()
    vk = sk.verify_key
    msgs = [os.urandom(32) for _ in range(n)]
    sigs = [sk.sign(m).signature for m in msgs]
    t0 = time.perf_counter()
    for m, s in zip(msgs, sigs, strict=True):
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
        rc = Receipt(g.domain, os.urandom(16), w.account, r.account, b"m" * 32, 0, 10, 10, os.urandom(32),
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
    from node.config import NodeConfig
    from node.runtime import Node

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


def empty_block_bytes(blocks: int = 20) -> tuple[float, float]:
    """Mean bytes (keys + values) that an empty one-validator block adds to a real LevelDB ledger: as stored now,
    and with each block record rewritten in the whole wire form stored before (everything else the same)."""
    from node.ledger.core.chain import commit_block, propose
    from node.ledger.store import LedgerStore

    val = Identity.from_seed(dev_seed(0))
    g = Genesis("tally-devnet", 0, (val.account,), ((val.account, 100 * C, 200 * C),), Params(block_time_ms=200))
    out = []
    with tempfile.TemporaryDirectory() as d:
        for legacy in (False, True):
            store = LedgerStore(Path(d) / f"db{legacy}", g)
            state = store.replay()
            grown = []
            for i in range(blocks):
                block, new, _ = propose(state, [], val, 1000 + i, store.last_commit())
                commit = commit_block(val, block)
                before = sum(len(k) + len(v) for k, v in store.db.iterator())
                store.append(block, commit, state, new)
                if legacy:
                    store.db.put(b"B" + block.height.to_bytes(8, "big"),
                                 pack({"b": block.to_wire(), "c": [list(x) for x in commit]}))
                grown.append(sum(len(k) + len(v) for k, v in store.db.iterator()) - before)
                state = new
            store.close()
            out.append(statistics.mean(grown[1:]))  # the first block also writes the state once
    return out[0], out[1]


def idle_blocks_per_minute(seconds: float, heartbeat_ms: int) -> float:
    """Blocks per minute that one validator (real libp2p host, LevelDB) makes with nothing to do, block time
    200 ms, watched for ``seconds`` after its first block."""
    import trio

    from node.ledger.service import LedgerService
    from node.ledger.store import LedgerStore
    from node.p2p.host import P2PHost

    val = Identity.from_seed(dev_seed(0))
    g = Genesis("tally-test-idle", 0, (val.account,), ((val.account, 100 * C, 200 * C),),
                Params(block_time_ms=200, heartbeat_ms=heartbeat_ms))

    async def main(tmp: Path) -> float:
        store = LedgerStore(tmp / "db", g)
        try:
            async with P2PHost(val, 0, g.chain_id, genesis_hash=g.hash).running() as host:
                svc = LedgerService(store, g, val, host)
                async with trio.open_nursery() as n:
                    n.start_soon(svc.run)
                    await svc.wait_for_height(1, 30)
                    h0, t0 = svc.state.height, time.monotonic()
                    await trio.sleep(seconds)
                    made, took = svc.state.height - h0, time.monotonic() - t0
                    n.cancel_scope.cancel()
        finally:
            store.close()
        return made * 60 / took

    with tempfile.TemporaryDirectory() as d:
        return trio.run(main, Path(d))


def idle_line(seconds: float, heartbeat_ms: int) -> str:
    """The ``--idle`` report: bytes per empty block and blocks per idle minute, quiet and as before."""
    now_b, before_b = empty_block_bytes()
    quiet = idle_blocks_per_minute(seconds, heartbeat_ms)
    every = idle_blocks_per_minute(seconds, 0)
    return (f"idle chain, 1 validator, block time 200 ms: {now_b:.0f} B stored per empty block (whole wire form "
            f"as before: {before_b:.0f} B); {quiet:.1f} blocks per idle minute with heartbeat {heartbeat_ms} ms, "
            f"{every:.1f} with heartbeat = block time (before); watched {seconds:g} s each")


def flood_cost(n: int) -> tuple[float, float]:
    """Seconds per flood transaction refused by :class:`~node.ledger.service.LedgerService`'s gossip handler, with
    the default per-peer refusal budget and without one."""
    from dataclasses import replace

    import trio

    from node.ledger.core.tx import Transfer
    from node.ledger.service import LedgerService
    from node.ledger.store import LedgerStore

    keys = [Identity.from_seed(dev_seed(100 + i)) for i in range(5)]
    val = Identity.from_seed(dev_seed(0))
    g = Genesis("bench-flood", 0, (val.account,), tuple((k.account, C, 0) for k in [val, *keys[1:]]), Params())
    to = Identity.from_seed(dev_seed(1)).account
    msgs = [(pack((Transfer(g.domain, k.account, to, 10 * C + i, 0) if i % 2 else
                   Transfer(g.domain, k.account, to, 1, 1000 + i)).signed(k).to_wire()), k.peer_id)
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
                        await svc._on_tx_gossip(data, peer)  # noqa: B023 - run() runs within this iteration

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
    ap.add_argument("--idle", type=float, default=0, metavar="SECONDS",
                    help="only an idle chain's cost: bytes per empty block, blocks per idle minute (watched SECONDS)")
    ap.add_argument("--heartbeat-ms", type=int, default=2000, help="heartbeat_ms for --idle (default %(default)s)")
    ap.add_argument("--scale", action="store_true",
                    help="only the ledger at 10^4..10^6 receipts held (issue 13 targets; options below)")
    ap.add_argument("--rate", action="store_true",
                    help="only the receipt rate at 10^4 and 10^6 live receipts (options --store-dir, --rate-blocks, "
                         "--rate-per-block, --profile)")
    ap.add_argument("--network", type=int, default=0, metavar="SERVERS",
                    help="only one validator under the settlement traffic of SERVERS workers (tabs and epoch batches, "
                         "issue 37; bench/ledger_network.py)")
    ap.add_argument("--sessions-per-s", type=float, default=10.0, help="--network: sessions each server serves a "
                                                                       "second (default %(default)s)")
    ap.add_argument("--network-blocks", type=int, default=30, help="--network: timed blocks (default %(default)s)")
    ap.add_argument("--tabs-per-server", type=int, default=10, help="--network: tabs open per server (default "
                                                                    "%(default)s)")
    ap.add_argument("--touched", type=int, default=10, help="--network: tabs a server's batch settles per epoch "
                                                            "(default %(default)s)")
    ap.add_argument("--record", choices=["floor", "new"], default="floor",
                    help="--network: workers at the sampling floor (default) or new (m draws per batch)")
    ledger_scale.add_args(ap)
    ledger_rate.add_args(ap)
    args = ap.parse_args()
    if args.network:
        raw = raw_verify_rate(20_000)
        r = ledger_network.run(args.network, args.sessions_per_s, args.network_blocks, args.tabs_per_server,
                               args.touched, args.record)
        print(f"network of {r['servers']} servers x {r['sessions_per_s']:g} sessions/s; epoch {r['epoch_blocks']} "
              f"blocks of 500 ms, {r['per_batch']} receipts per batch, m = {r['m']} (workers: {r['record']}); "
              f"{r['tabs']} tabs, {r['touched']} settled per batch; setup {r['setup_s']:.0f} s, traffic made in "
              f"{r['gen_s']:.0f} s (untimed)")
        print(f"  validator per block: median {r['median_ms']:.0f} ms, max {r['max_ms']:.0f} ms over {r['blocks']} "
              f"blocks -> {'kept up' if r['kept_up'] else 'DID NOT keep up'} with 500 ms blocks")
        print(f"  receipts covered: {r['receipts_per_s']:10.0f} /s in the timed blocks, "
              f"{r['servers'] * r['sessions_per_s']:.0f} /s offered (target >= 100,000; a block carries "
              f"{r['servers'] // r['epoch_blocks']} or {-(-r['servers'] // r['epoch_blocks'])} batches); "
              f"{r['receipts_per_s'] / raw:.1f}x the raw verifies/s")
        print(f"  ledger transactions: {r['txs_per_s']:7.0f} /s; raw pynacl verify (1 thread) {raw:.0f} /s")
        print(f"  state bytes per receipt: {r['state_bytes_per_receipt']:.3f} in the tables (target <= 1), "
              f"{r['tree_bytes_per_receipt']:.2f} in tree nodes; per table: {r['by_table']}")
        print(f"  block ms: {r['block_ms']}")
        return
    if args.rate:
        print("\n".join(ledger_rate.run_rates(args.store_dir, args.rate_blocks, args.rate_per_block, args.profile)))
        return
    if args.scale:
        ledger_scale.run_scale(args.sizes, args.timeout, args.empty, args.full, args.profile, args.keep, args.cap,
                               not args.no_mmap, args.per_block)
        return
    if args.idle:
        print(idle_line(args.idle, args.heartbeat_ms))
        return
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
    print("\n".join(ledger_rate.run_rates(args.store_dir, args.rate_blocks, args.rate_per_block, args.profile)))
    lat = sorted(finality(args.heights))
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    print(f"finality, 4 validators on loopback ({len(lat)} block commits): "
          f"median {statistics.median(lat) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms   (target: median < 1000 ms)")
    print(idle_line(10.0, args.heartbeat_ms))


if __name__ == "__main__":
    main()
