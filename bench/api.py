"""API benchmark: requests/s of the balance and block endpoints of a live node, beside the same paths served by
a bare hypercorn app that returns a constant, measured in one run by one load generator in a second process.

The node is a real one (tiny model, LevelDB ledger, Tendermint producing a block every ``--block-ms``, the full
middleware stack: Host/Origin checks, security headers, routing, validation); the bare app is a raw ASGI
callable on the same hypercorn trio worker. The load generator (``--load``, started as a subprocess) keeps
``--conns`` HTTP/1.1 keep-alive connections busy on 127.0.0.1 for ``--seconds`` after a warm-up and counts
complete 200 responses; node and bare app are measured in alternation for ``--rounds`` rounds and the medians
compared. The figure is the ratio node / bare for each endpoint (target >= 0.5).

Usage: ``.venv/bin/python bench/api.py [--conns 32] [--seconds 3] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# ---------------------------------------------------------------------- load generator (second process)

async def _worker(host: str, port: int, paths: list[bytes], stop_at: float, counts: dict, start_at: float):
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    try:
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                return
            path = paths[i % len(paths)]
            i += 1
            writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1:" + str(port).encode() + b"\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            if time.perf_counter() >= start_at:
                counts["ok" if status == 200 else "bad"] += 1
    finally:
        writer.close()


async def _load(url: str, paths: list[str], conns: int, warmup: float, seconds: float) -> dict:
    host, port = url.split("//")[1].split(":")
    counts = {"ok": 0, "bad": 0}
    t0 = time.perf_counter()
    start_at, stop_at = t0 + warmup, t0 + warmup + seconds
    await asyncio.gather(*[_worker(host, int(port), [p.encode() for p in paths], stop_at, counts, start_at)
                           for _ in range(conns)])
    return {"ok": counts["ok"], "bad": counts["bad"], "rps": counts["ok"] / seconds}


def load_main(args) -> None:
    print(json.dumps(asyncio.run(_load(args.load, args.paths, args.conns, args.warmup, args.seconds))))


# ---------------------------------------------------------------------- servers (this process)

def bare_app(body: bytes):
    """A raw ASGI app answering ``body`` as JSON to every request."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def run_bench(args) -> None:
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from node.compute.model import make_tiny
    from node.config import NodeConfig
    from node.identity import Identity, dev_seed
    from node.ledger.genesis import Genesis, Params
    from node.runtime import Node

    tmp = Path(tempfile.mkdtemp(prefix="tally-bench-api-"))
    import atexit
    import shutil

    atexit.register(shutil.rmtree, tmp, True)
    model = make_tiny(tmp / "models", seed=0)
    keys = [Identity.from_seed(dev_seed(i)) for i in range(4)]
    genesis = Genesis("tally-test-bench", 0, (keys[0].account,),
                      tuple([(keys[0].account, 1000 * 10**9, 0)] + [(k.account, 100 * 10**9, 200 * 10**9)
                                                                    for k in keys[1:]]),
                      Params(block_time_ms=args.block_ms))
    node = Node(NodeConfig(data_dir=tmp / "n0", genesis=genesis, model_dir=model, seed=dev_seed(0)))
    results: dict[str, dict] = {}

    async def measure(name: str, url: str, paths: list[str]) -> None:
        cmd = [sys.executable, __file__, "--load", url, "--conns", str(args.conns), "--seconds", str(args.seconds),
               "--warmup", str(args.warmup), "--paths", *paths]
        out = await trio.to_thread.run_sync(lambda: subprocess.run(cmd, capture_output=True, text=True, check=True))
        results[name] = json.loads(out.stdout)

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(node.run)
            await node.started.wait()
            await node.ledger.wait_for_height(args.blocks, timeout=120)
            balance = f"/v1/accounts/{keys[1].peer_id}"
            heights = [f"/v1/blocks/{h}" for h in range(1, args.blocks + 1)]
            cfg = Config()
            cfg.bind = ["127.0.0.1:0"]
            cfg.accesslog = None
            import httpx

            get = lambda p: httpx.get(node.api_url + p, timeout=10).content  # noqa: E731
            bal_body = await trio.to_thread.run_sync(get, balance)
            blk_body = await trio.to_thread.run_sync(get, heights[0])
            binds_bal = await n.start(lambda task_status: serve(bare_app(bal_body), cfg, task_status=task_status))
            cfg2 = Config()
            cfg2.bind = ["127.0.0.1:0"]
            cfg2.accesslog = None
            binds_blk = await n.start(lambda task_status: serve(bare_app(blk_body), cfg2, task_status=task_status))
            for r in range(args.rounds):  # interleaved, so drifting background load hits both sides alike
                await measure(f"node balance {r}", node.api_url, [balance])
                await measure(f"bare balance {r}", binds_bal[0], [balance])
                await measure(f"node block {r}", node.api_url, heights)
                await measure(f"bare block {r}", binds_blk[0], heights)
            n.cancel_scope.cancel()

    trio.run(main)
    import statistics

    print(f"API benchmark: {args.conns} keep-alive connections from a second process on 127.0.0.1, "
          f"{args.warmup:g} s warm-up + {args.seconds:g} s per target, {args.rounds} interleaved rounds (medians); "
          f"node producing a block every {args.block_ms} ms; block requests cycle over heights 1..{args.blocks}")
    print(f"{'endpoint':10} {'node req/s':>11} {'bare req/s':>11} {'ratio':>6}   (non-200 node/bare)")
    for ep in ("balance", "block"):
        a = [results[f"node {ep} {r}"] for r in range(args.rounds)]
        b = [results[f"bare {ep} {r}"] for r in range(args.rounds)]
        ra, rb = statistics.median(x["rps"] for x in a), statistics.median(x["rps"] for x in b)
        print(f"{ep:10} {ra:11.0f} {rb:11.0f} {ra / rb:6.2f}   ({sum(x['bad'] for x in a)}/{sum(x['bad'] for x in b)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conns", type=int, default=32)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--blocks", type=int, default=20, help="blocks to wait for before measuring")
    p.add_argument("--block-ms", type=int, default=500)
    p.add_argument("--load", help=argparse.SUPPRESS)
    p.add_argument("--paths", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.load:
        load_main(args)
    else:
        run_bench(args)


if __name__ == "__main__":
    main()
