"""Inference benchmark: greedy generation through 3 span servers over libp2p against the same model in one process.

Prints, from one run on this machine:
  * tokens/s of greedy generation through 3 local span servers over libp2p (TCP + Noise + Yamux on 127.0.0.1,
    the real session protocol with per-step receipts), beside tokens/s of the same model generating in one process
    (:func:`node.compute.reference.local_generate`); the ratio is the figure (target >= 0.8);
  * bytes on the wire per token per hop (every byte of the client's TCP connections to the servers, as the
    kernel counted them with ``ss``: Noise, Yamux, framing, acks, gossip included) beside the raw hidden-state
    bytes of the same steps (input + output, float32) (target <= 1.1);
  * the time spent on receipts (commitments, incremental Merkle roots, receipt ids, signing, countersigning
    and checking signatures, in the client and in all three servers) as a share of generation time
    (target <= 1 %);
  * with ``--wan``: the same generation with every client-server link through a TCP relay on 127.0.0.1 that
    delays each direction by 25 ms (this kernel has no netem), its tokens/s beside the local figure.
  * with ``--hosts`` (root only): each server and the client in its own Linux network namespace, joined by a
    bridge (tests/net/netns.py), the servers listening on their namespace's address: the traffic crosses veth
    links and a bridge, not loopback. The same figures, beside the same one-process baseline.

The 3 servers run in the bench's trio loop by default, each a full SpanServer with its own libp2p host (its own
TCP connection, Noise session and Yamux streams to the client) and its own torch worker thread; ``--processes``
runs each in its own process instead (on 2 cores, 4 processes lose more to scheduling and cache contention than
the protocol costs); ``--hosts`` runs each in its own process and namespace, and the client in a fourth
namespace (a child process of the bench). The output says which ran.

With ``--redundancy 2`` (issue 14): 6 servers, two disjoint routes of 3 spans each, and one client generating
alternately with redundancy 1 (one route) and 2 (every step on both routes, compared hop by hop:
:mod:`node.inference.redundant`); prints the two tokens/s side by side and their ratio, the cost of redundancy in
speed (in credits it is exactly 2: both routes are paid). The model is the tiny one unless ``--model smollm2``.

With ``--quantize int8`` (or ``--model int8``, short for ``--model smollm2 --quantize int8``; issue 15): the
float model and its int8 copy (:mod:`node.models.quantize`, made once with ``node model add smollm2 --quantize
int8`` if the cache has none) side by side, each in a fresh process holding the whole model as one span plus the
client head: greedy tokens/s (KV cache, one token per step) and resident memory (VmRSS after loading, and the
peak VmHWM), with the int8 weights resident and dequantized per matmul, and, for comparison, dequantized to float32
at load; ratios to the float model printed, and how many greedy tokens the int8 copy shares with the float one.

With ``--hosts --nat port|random`` (issue 25): real ``node start`` processes, the servers and the client each behind
a NAT of its own, A a public relay, against the same four nodes on loopback (:mod:`nat_swarm`).

Usage: ``.venv/bin/python bench/inference.py [--tokens 48] [--runs 3] [--wan] [--processes | --hosts [--nat port]]
[--compression none|fp16|zstd|fp16+zstd] [--model smollm2|tiny|int8] [--threads 1] [--redundancy 2]
[--quantize int8]``
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

import trio

from tests.net.netns import Netns, NetnsUnavailable

CHAIN = "tally-bench"
PRICE = 1_000_000
STATS = "/tally/bench/stats/1.0.0"
PROMPT = "The three most important inventions in human history are"


# ------------------------------------------------------------------ server process

async def serve(args, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Child mode: one span server (libp2p host + SpanServer, no ledger) until killed. With ``--in-process`` the
    bench runs this in its own trio loop instead, and the server's address comes back through ``task_status``."""
    import torch

    from node.blobs import BlobStore
    from node.compute.executor import TorchExecutor
    from node.compute.span import SpanModel
    from node.identity import Identity, dev_seed
    from node.inference import receipts
    from node.inference.server import INFERENCE_PROTOCOL, SpanServer
    from node.p2p.host import P2PHost

    torch.set_num_threads(args.threads)
    ident = Identity.from_seed(dev_seed(args.key))
    host = P2PHost(ident, 0, CHAIN, listen_host=args.listen_host)
    start, end = (int(x) for x in args.serve.split(":"))
    server = SpanServer(ident, CHAIN, SpanModel(Path(args.model_dir), start, end), TorchExecutor(args.threads),
                        BlobStore(Path(tempfile.mkdtemp(prefix="tally-bench-"))), lambda: 0, PRICE,
                        penalize=host.penalize)
    host.set_handler(INFERENCE_PROTOCOL, server.handle)
    sums = [0.0, 0.0, 0]  # one-token steps since the last reset: seconds request to reply, seconds in forward, n
    observe = server.stats.observe

    def observed(latency: float, compute: float) -> None:
        observe(latency, compute)
        sums[0] += latency
        sums[1] += compute
        sums[2] += 1

    server.stats.observe = observed

    async def stats(msg: dict, peer: str) -> dict:
        n = max(1, sums[2])  # means over the run (the announced figures are EWMAs)
        out = {"receipt_s": receipts.CLOCK.seconds, "receipt_cpu_s": receipts.CLOCK.cpu_seconds,
               "receipt_calls": receipts.CLOCK.calls,
               "tokens": server.tokens_served, "latency": sums[0] / n, "compute": sums[1] / n}
        if msg.get("reset"):
            receipts.CLOCK.reset()
            sums[:] = [0.0, 0.0, 0]
        return out

    host.set_request_handler(STATS, stats)
    async with host.running(), trio.open_nursery() as n:
        await server.measure()
        n.start_soon(server.announce_loop, host, 1.0)
        info = {"peer": ident.peer_id, "addr": host.addrs[0]}
        if task_status is trio.TASK_STATUS_IGNORED:  # a child process: report on stdout
            print(json.dumps(info), flush=True)
        else:
            task_status.started(info)
        await trio.sleep_forever()


# ------------------------------------------------------------------ the TCP relay for --wan

async def relay(target_host: str, target_port: int, delay: float, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on 127.0.0.1 and forward every connection to ``target_host:target_port``, each direction delayed by
    ``delay`` seconds (chunks keep their order; no bandwidth limit). Reports its port through ``task_status``."""
    async def pump(src, dst) -> None:
        send, recv = trio.open_memory_channel(math.inf)

        async def reader() -> None:
            async with send:
                try:
                    async for chunk in src:
                        send.send_nowait((trio.current_time() + delay, chunk))
                except trio.BrokenResourceError:
                    pass

        async def writer() -> None:
            async for due, chunk in recv:
                await trio.sleep_until(due)
                try:
                    await dst.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, AttributeError):
                await dst.send_eof()

        async with trio.open_nursery() as n:
            n.start_soon(reader)
            n.start_soon(writer)

    async def handle(client) -> None:
        try:
            server = await trio.open_tcp_stream(target_host, target_port)
        except OSError:
            await client.aclose()
            return
        async with client, server, trio.open_nursery() as n:
            n.start_soon(pump, client, server)
            n.start_soon(pump, server, client)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


# ------------------------------------------------------------------ measuring

def tcp_bytes(dests: list[tuple[str, int]]) -> int:
    """Bytes sent (acknowledged) plus bytes received on this machine's (this namespace's) TCP connections to
    ``dests`` (IPv4 address, port), from ss."""
    total = 0
    for ip, port in dests:
        out = subprocess.run(["ss", "-tinH", "dst", f"{ip}:{port}"], capture_output=True, text=True).stdout
        total += sum(int(x) for x in re.findall(r"bytes_acked:(\d+)", out))
        total += sum(int(x) for x in re.findall(r"bytes_received:(\d+)", out))
    return total


class BenchLedger:
    """What the client needs from a ledger: the chain id and the price. Receipts are built, signed and
    countersigned as always; nothing is submitted (no validator runs in the bench)."""

    chain_id = CHAIN

    class genesis:
        class params:
            price_per_token_block = PRICE

    class state:  # every server stands as a new one (the routes weigh no ledger record)
        height = 0

        @staticmethod
        def account(a: bytes):
            from node.ledger.core.rows import Account
            return Account()

    async def submit(self, tx) -> bytes:
        return tx.id


async def run_client(args, model_dir: Path, servers: list[dict], prompt: list[int], via: dict[str, int] | None,
                     label: str, local_run=None) -> dict:
    """Connect a fresh client (through relays when ``via`` maps peer -> relay port), generate ``args.runs`` times,
    return the measurements. ``local_run`` (from :func:`local_baseline`): run once just before each swarm run, in a
    worker thread (the servers idle meanwhile), so each run's ratio compares the machine at one moment."""
    from node.blobs import BlobStore
    from node.compute.executor import TorchExecutor
    from node.compute.head import ClientHead
    from node.compute.model import load_manifest
    from node.identity import Identity
    from node.inference import receipts
    from node.inference.swarm import SwarmTable
    from node.p2p.host import P2PHost

    manifest = load_manifest(model_dir)
    head = ClientHead(model_dir)  # before connecting: a fresh process (--hosts) takes seconds to import it, and
    host = P2PHost(Identity.generate(), 0, CHAIN)  # the servers' announcements (TTL 3 s) would lapse meanwhile
    swarm = SwarmTable()
    addrs = [s["addr"] if via is None else f"/ip4/127.0.0.1/tcp/{via[s['peer']]}/p2p/{s['peer']}" for s in servers]
    ports = [(a.split("/")[2], int(a.split("/")[4])) for a in addrs]
    async with host.running():
        await host.subscribe(host.topic("shards"), swarm.on_announcement)
        await host.connect(addrs)
        with trio.fail_after(30):
            while len(swarm.live(manifest.model_id)) < len(servers):
                await trio.sleep(0.1)
        client = _timed_client_class()(host.identity, host, head, manifest, BenchLedger(),
                             TorchExecutor(args.threads), BlobStore(Path(tempfile.mkdtemp(prefix="tally-bench-"))),
                             swarm, compression=args.compression, submit=False)
        warm = await client.generate(prompt, 8)
        wire = 0
        gens, shares = [], []  # shares: per run, (receipt wall s, receipt CPU s, wall s)
        client_receipt_s = client_receipt_cpu = 0.0
        server_stats = [{"receipt_s": 0.0, "receipt_cpu_s": 0.0} for _ in servers]
        local_rates: list[float] = []
        for _ in range(args.runs):  # receipts are measured per run, like tokens/s, and reported as the median
            if local_run is not None:
                local_rates.append((await trio.to_thread.run_sync(local_run))[0])
            for s in servers:
                await host.request(s["peer"], STATS, {"reset": True}, timeout=10)
            client.hop_s.clear()  # per-hop times, like the servers' latencies: the last run
            receipts.CLOCK.reset()
            bytes0 = tcp_bytes(ports)
            gens.append(await client.generate(prompt, args.tokens))
            wire += tcp_bytes(ports) - bytes0
            run_s, run_cpu = receipts.CLOCK.seconds, receipts.CLOCK.cpu_seconds
            client_receipt_s += run_s
            client_receipt_cpu += run_cpu
            stats = [await host.request(s["peer"], STATS, {}, timeout=10) for s in servers]
            if args.processes or args.hosts:  # in one process, one clock: the client's reading has it all
                for acc, st in zip(server_stats, stats, strict=False):
                    acc["receipt_s"] += st["receipt_s"]
                    acc["receipt_cpu_s"] += st["receipt_cpu_s"]
                run_s += sum(st["receipt_s"] for st in stats)
                run_cpu += sum(st["receipt_cpu_s"] for st in stats)
            shares.append((run_s, run_cpu, gens[-1].seconds))
        server_stats = [{**st, **acc} for st, acc in zip(stats, server_stats, strict=False)]  # latencies: the last run
    hops = len(gens[0].route)
    positions = sum(len(prompt) + args.tokens - 1 for _ in gens)  # per hop
    wall = sum(g.seconds for g in gens)
    receipt_s = client_receipt_s + sum(s["receipt_s"] for s in server_stats)
    receipt_cpu = client_receipt_cpu + sum(s["receipt_cpu_s"] for s in server_stats)
    return {"label": label, "tokens_s": statistics.median(args.tokens / g.seconds for g in gens),
            "runs": [round(args.tokens / g.seconds, 2) for g in gens], "tokens": gens[-1].tokens,
            "warm_tokens": warm.tokens, "route": gens[0].route, "hops": hops,
            "wire_per_token_hop": wire / (positions * hops), "receipt_s": receipt_s, "receipt_cpu": receipt_cpu,
            "client_receipt_s": client_receipt_s, "server_receipt_s": [s["receipt_s"] for s in server_stats],
            "wall": wall, "steps": args.runs * args.tokens, "shares": shares,
            "server_step_ms": [round(s["latency"] * 1e3, 2) for s in server_stats],
            "server_compute_ms": [round(s["compute"] * 1e3, 2) for s in server_stats],
            "client_hop_ms": [round(1e3 * sum(client.hop_s.get(p, [0.0])) / max(1, len(client.hop_s.get(p, []))), 2)
                              for p, _, _ in gens[0].route],
            "compression": gens[0].compression, "local_runs": local_rates,
            "paired": [args.tokens / g.seconds / lr for g, lr in zip(gens, local_rates, strict=False)]}


@functools.cache
def _timed_client_class():
    """A RouteClient subclass (made on first use: the client module imports torch)."""
    from node.inference.client import RouteClient

    class TimedRouteClient(RouteClient):
        """RouteClient that records, per peer, the wall seconds of each one-token step as the client sees it:
        encode, write, wait, read, decode (``hop_s``)."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.hop_s: dict[str, list[float]] = {}

        async def _step(self, hop, hidden, run):
            t0 = time.perf_counter()
            out = await super()._step(hop, hidden, run)
            if hidden.shape[1] == 1:
                self.hop_s.setdefault(hop.peer, []).append(time.perf_counter() - t0)
            return out

    return TimedRouteClient


def local_baseline(args, model_dir: Path, prompt: list[int]):
    """The one-process figure: ``(median tokens/s, runs, tokens, one_run)``; ``one_run()`` runs it once more and
    returns ``(tokens/s, tokens)`` (the model stays loaded), so a swarm run can be paired with one just before it."""
    from node.compute.reference import load_causal_lm, local_generate

    model = load_causal_lm(model_dir)
    local_generate(model_dir, prompt, 8, model=model)  # warm-up

    def one_run() -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        tokens = local_generate(model_dir, prompt, args.tokens, model=model)
        return args.tokens / (time.perf_counter() - t0), tokens

    rates, tokens = [], []
    for _ in range(args.runs):
        rate, tokens = one_run()
        rates.append(rate)
    return statistics.median(rates), rates, tokens, one_run


async def bench_redundancy(args, model_dir: Path, manifest, prompt: list[int]) -> None:
    """``--redundancy 2``: 6 servers (two disjoint routes of 3 spans), one client, both modes alternately."""
    from node.blobs import BlobStore
    from node.compute.executor import TorchExecutor
    from node.compute.head import ClientHead
    from node.compute.shards import assign_spans
    from node.identity import Identity
    from node.inference.client import RouteClient
    from node.inference.redundant import RedundantClient
    from node.inference.swarm import SwarmTable
    from node.p2p.host import P2PHost

    spans = assign_spans(manifest.num_blocks, 3) * 2
    procs = []
    try:
        async with trio.open_nursery() as local_servers:
            servers = []
            for key, (s, e) in enumerate(spans, start=1):
                if args.processes:
                    procs.append(subprocess.Popen(
                        [sys.executable, __file__, "--serve", f"{s}:{e}", "--key", str(key), "--model-dir",
                         str(model_dir), "--threads", str(args.threads)], stdout=subprocess.PIPE, text=True,
                        cwd=Path(__file__).parents[1]))
                else:
                    child = argparse.Namespace(**{**vars(args), "serve": f"{s}:{e}", "key": key,
                                                  "model_dir": str(model_dir)})
                    servers.append(await local_servers.start(serve, child))
            servers += [json.loads(await trio.to_thread.run_sync(p.stdout.readline)) for p in procs]
            host, swarm = P2PHost(Identity.generate(), 0, CHAIN), SwarmTable()
            head = ClientHead(model_dir)
            async with host.running():
                await host.subscribe(host.topic("shards"), swarm.on_announcement)
                await host.connect([s["addr"] for s in servers])
                with trio.fail_after(30):
                    while len(swarm.live(manifest.model_id)) < len(servers):
                        await trio.sleep(0.1)
                client = RouteClient(host.identity, host, head, manifest, BenchLedger(), TorchExecutor(args.threads),
                                     BlobStore(Path(tempfile.mkdtemp(prefix="tally-bench-"))), swarm,
                                     compression=args.compression, submit=False)
                red = RedundantClient(client, dispute=False)
                modes = {1: client.generate, 2: red.generate}
                for gen in modes.values():
                    await gen(prompt, 8)  # warm-up: sessions, caches, round trips measured
                rates: dict[int, list[float]] = {1: [], 2: []}
                last = {}
                for _ in range(args.runs):  # alternately, so that a slow spell of the machine hits both
                    for k, gen in modes.items():
                        last[k] = await gen(prompt, args.tokens)
                        rates[k].append(args.tokens / last[k].seconds)
            local_servers.cancel_scope.cancel()
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    one, two = (statistics.median(rates[k]) for k in (1, 2))
    where = "6 processes" if args.processes else "the bench's trio loop"
    print(f"6 servers over libp2p ({where}), two disjoint routes of {len(spans) // 2} spans:")
    print(f"  redundancy 1 (one route):          {one:7.2f} tokens/s  (runs {[round(x, 2) for x in rates[1]]})")
    print(f"  redundancy 2 (both, compared):     {two:7.2f} tokens/s  (runs {[round(x, 2) for x in rates[2]]})")
    print(f"  ratio redundancy 2 / redundancy 1: {two / one:7.3f}   (in credits redundancy 2 costs exactly "
          f"twice: both routes are paid)")
    print(f"  identical tokens: {str(last[1].tokens == last[2].tokens).lower()}; mismatches: "
          f"{'none' if last[2].mismatch is None else last[2].mismatch.describe()}; routes "
          f"{[[(p[-6:], s, e) for p, s, e in rt] for rt in last[2].routes]}", flush=True)


async def bench(args) -> None:
    import torch

    from node.compute.head import ClientHead
    from node.compute.model import load_manifest
    from node.compute.shards import assign_spans

    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args)
    manifest = load_manifest(model_dir)
    tok = ClientHead(model_dir).tokenizer
    prompt = tok.encode(PROMPT) if tok is not None else [5, 17, 42, 99, 3, 8, 13, 21]
    print(f"model {manifest.name}: {manifest.num_blocks} blocks, hidden {manifest.hidden_size}; prompt "
          f"{len(prompt)} tokens; {args.tokens} new tokens greedy, median of {args.runs} runs; torch threads "
          f"{args.threads} in every process; compression {args.compression}", flush=True)
    if args.redundancy == 2:
        await bench_redundancy(args, model_dir, manifest, prompt)
        return
    if args.quantize:
        bench_quantized(args, model_dir, prompt)
        return
    local, local_runs, local_tokens, args.local_run = local_baseline(args, model_dir, prompt)
    print(f"one process (local_generate):     {local:7.2f} tokens/s  (runs {[round(r, 2) for r in local_runs]})",
          flush=True)
    spans = assign_spans(manifest.num_blocks, args.servers)
    if args.hosts:
        await _bench_hosts(args, model_dir, spans, prompt, local, local_tokens)
        return
    procs = []
    try:
        async with trio.open_nursery() as local_servers:
            if not args.processes:
                servers = []
                for key, (s, e) in enumerate(spans, start=1):
                    child = argparse.Namespace(**{**vars(args), "serve": f"{s}:{e}", "key": key,
                                                  "model_dir": str(model_dir)})
                    servers.append(await local_servers.start(serve, child))
            else:
                for key, (s, e) in enumerate(spans, start=1):
                    procs.append(subprocess.Popen(
                        [sys.executable, __file__, "--serve", f"{s}:{e}", "--key", str(key), "--model-dir",
                         str(model_dir), "--threads", str(args.threads)], stdout=subprocess.PIPE, text=True,
                        cwd=Path(__file__).parents[1]))
                servers = [json.loads(await trio.to_thread.run_sync(p.stdout.readline)) for p in procs]
            await _measure(args, model_dir, manifest, servers, prompt, local, local_tokens)
            local_servers.cancel_scope.cancel()
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


async def _wait_line(proc: subprocess.Popen, what: str, timeout: float = 300.0) -> dict:
    """The JSON line a child prints once ready (``timeout`` seconds at most; the child is killed by the caller).

    Raises:
        RuntimeError: the child exited, printed something else, or took too long.
    """
    with trio.move_on_after(timeout):
        line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(f"{what} did not start (exit {proc.poll()}, printed {line!r})") from None
    raise RuntimeError(f"{what} did not start within {timeout:.0f} s")


async def _bench_hosts(args, model_dir: Path, spans, prompt: list[int], local: float,
                       local_tokens: list[int]) -> None:
    """``--hosts``: the 3 servers and the client each in a process in its own network namespace on one bridge
    (:class:`tests.net.netns.Netns`); the client child (``--client-of``) measures and prints the report. Every
    namespace and process is removed at the end, also on Ctrl-C."""
    root = Path(__file__).parents[1]
    with Netns("bench") as net:
        hosts = [net.add_host(f"s{i}") for i in range(1, len(spans) + 1)]
        client = net.add_host("client")
        procs = [net.popen(h, [sys.executable, __file__, "--serve", f"{s}:{e}", "--key", str(key), "--model-dir",
                               str(model_dir), "--threads", str(args.threads), "--listen-host", h.ip],
                           stdout=subprocess.PIPE, text=True, cwd=root)
                 for key, ((s, e), h) in enumerate(zip(spans, hosts, strict=False), start=1)]
        servers = [await _wait_line(p, f"server in {h.ns}") for p, h in zip(procs, hosts, strict=False)]
        print(f"--hosts: network namespaces on one bridge, run {net.run_id}: servers "
              f"{[h.ip for h in hosts]}, client {client.ip}", flush=True)
        spec = Path(tempfile.mkdtemp(prefix="tally-bench-")) / "hosts.json"
        spec.write_text(json.dumps({"model_dir": str(model_dir), "servers": servers, "prompt": prompt,
                                    "local": local, "local_tokens": local_tokens}))
        child = net.popen(client, [sys.executable, __file__, *sys.argv[1:], "--client-of", str(spec)], cwd=root)
        while child.poll() is None:  # polled, so that Ctrl-C reaches the bench (and Netns cleans up)
            await trio.sleep(0.2)
        if child.returncode:
            raise SystemExit(f"the client in {client.ns} failed (exit {child.returncode})")


def _veth_bytes() -> int:
    """Bytes received plus sent on this namespace's eth0 (the veth to the bridge); 0 where there is none."""
    try:
        return sum(int(Path(f"/sys/class/net/eth0/statistics/{k}_bytes").read_text()) for k in ("rx", "tx"))
    except OSError:
        return 0


async def client_of(args) -> None:
    """Child mode of ``--hosts``: the client, inside its namespace, generates through the servers of the spec file
    written by :func:`_bench_hosts` and prints the report (ratios against the parent's one-process run)."""
    import torch

    from node.compute.model import load_manifest

    torch.set_num_threads(args.threads)
    spec = json.loads(Path(args.client_of).read_text())
    model_dir = Path(spec["model_dir"])
    before = _veth_bytes()
    await _measure(args, model_dir, load_manifest(model_dir), spec["servers"], spec["prompt"], spec["local"],
                   spec["local_tokens"])
    print(f"  the client's veth (eth0 of its namespace) carried {(_veth_bytes() - before) / 1e6:.1f} MB in all "
          f"(warm-up, every run{', the relays' if args.wan else ''})", flush=True)


async def _measure(args, model_dir, manifest, servers, prompt, local, local_tokens) -> None:
    """Generate through the running servers directly, then (``--wan``) through delaying relays; print both."""
    direct = await run_client(args, model_dir, servers, prompt, None, "libp2p", local_run=args.local_run)
    report(args, manifest, direct, local, local_tokens)
    if args.wan:
        async with trio.open_nursery() as n:
            via = {}
            for s in servers:
                parts = s["addr"].split("/")
                via[s["peer"]] = await n.start(relay, parts[2], int(parts[4]), args.delay)
            wan = await run_client(args, model_dir, servers, prompt, via, "wan")
            n.cancel_scope.cancel()
        print(f"--wan: every link through a TCP relay adding {args.delay * 1e3:.0f} ms each way", flush=True)
        print(f"  tokens/s over the relays:       {wan['tokens_s']:7.2f}  (runs {wan['runs']}) beside "
              f"{direct['tokens_s']:.2f} local over libp2p and {local:.2f} in one process; identical tokens: "
              f"{str(wan['tokens'] == direct['tokens']).lower()}")
        print(f"  bytes on the wire per token per hop: {wan['wire_per_token_hop']:.0f}")


def report(args, manifest, r: dict, local: float, local_tokens: list[int]) -> None:
    raw = 2 * manifest.hidden_size * 4  # float32 input + output of one position on one hop
    steps_hops = r["steps"] * r["hops"]
    n = args.servers
    where = (f"{n} processes in {n} network namespaces, over veth" if args.hosts else
             f"{n} processes" if args.processes else "the bench's trio loop")
    print(f"{n} servers over libp2p ({where}): {r['tokens_s']:7.2f} tokens/s  (runs {r['runs']})")
    if r.get("paired"):  # each swarm run beside a one-process run just before it (the machine drifts over minutes)
        print(f"  ratio to one process:           {statistics.median(r['paired']):7.3f}   (target >= 0.8; median of "
              f"{len(r['paired'])} runs each beside a one-process run just before it: "
              f"{[round(x, 3) for x in r['paired']]}, one process then {[round(x, 2) for x in r['local_runs']]}; "
              f"against the first runs' median: {r['tokens_s'] / local:.3f})")
    else:
        print(f"  ratio to one process:           {r['tokens_s'] / local:7.3f}   (target >= 0.8)")
    print(f"  identical tokens to one process: {str(r['tokens'] == local_tokens).lower()}")
    print(f"  route: {[(p[:12], s, e) for p, s, e in r['route']]}; per one-token step (means, last run), server "
          f"ms: {r['server_step_ms']} from request to reply, {r['server_compute_ms']} of it in the span's forward")
    hop_ms = r["client_hop_ms"]
    net_ms = [round(c - s, 2) for c, s in zip(hop_ms, r["server_step_ms"], strict=False)]
    token_ms = 1e3 * r["shares"][-1][2] / (r["steps"] / len(r["shares"]))  # the last run, like hop_ms
    print(f"  per one-token step, client ms per hop from sending to the decoded reply: {hop_ms}; less the server's "
          f"time: {net_ms} (both ends' libp2p stack and the wire); per token {token_ms:.1f} ms, "
          f"{token_ms - sum(hop_ms):.1f} of it in the client outside the hops (LM head, embedding, receipts)")
    print(f"  bytes on the wire per token per hop: {r['wire_per_token_hop']:.0f} beside raw hidden states "
          f"{raw} (float32 in + out): {r['wire_per_token_hop'] / raw:.3f}   (target <= 1.1)")
    who = ("client and servers, one process" if not (args.processes or args.hosts) else
           f"client {r['client_receipt_s'] * 1e3:.1f} ms + servers {sum(r['server_receipt_s']) * 1e3:.1f} ms")
    wall_shares = sorted(100 * rs / w for rs, _, w in r["shares"])
    cpu_shares = sorted(100 * rc / w for _, rc, w in r["shares"])
    print(f"  receipts ({who}: {r['receipt_s'] * 1e3:.1f} ms wall over {r['wall']:.2f} s of generation; "
          f"{r['receipt_s'] / steps_hops * 1e6:.0f} us per step per hop): "
          f"{statistics.median(wall_shares):.2f} % of step time, median of runs "
          f"{[round(x, 2) for x in wall_shares]}   (target <= 1 %)")
    print(f"    counting CPU time instead of wall time (what the OS gave other processes meanwhile excluded): "
          f"{r['receipt_cpu'] / steps_hops * 1e6:.0f} us per step per hop, "
          f"{statistics.median(cpu_shares):.2f} % of step time (median)", flush=True)


def _proc_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def mem_probe(args) -> None:
    """Child mode of ``--quantize``: load ``--model-dir`` as one span plus the client head, generate greedily and
    print one JSON line (tokens/s median, tokens, RSS in MB after imports, after load, peak)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, DynamicCache  # noqa: F401  (their lazy imports before `base`)

    from node.compute.head import ClientHead
    from node.compute.model import load_manifest
    from node.compute.span import SpanModel

    torch.set_num_threads(args.threads)
    base = _proc_kb("VmRSS")
    m = load_manifest(Path(args.model_dir))
    span = SpanModel(Path(args.model_dir), 0, m.num_blocks, int8_resident=args.mem_probe != "int8-dequantized")
    head = ClientHead(Path(args.model_dir))
    loaded = _proc_kb("VmRSS")
    weights = sum(t.numel() * t.element_size() for t in [*span.net.parameters(), *span.net.buffers()])
    prompt = json.loads(args.prompt_ids)

    def generate(n: int) -> list[int]:
        cache, step, out = span.new_cache(), torch.tensor([prompt]), []
        for _ in range(n):
            out.append(head.next_token(span.forward(head.embed(step), cache)))
            step = torch.tensor([[out[-1]]])
        return out

    generate(4)  # warm-up
    rates = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        tokens = generate(args.tokens)
        rates.append(args.tokens / (time.perf_counter() - t0))
    print(json.dumps({"tokens_s": statistics.median(rates), "runs": [round(r, 2) for r in rates], "tokens": tokens,
                      "rss_base_mb": base / 1024, "rss_loaded_mb": loaded / 1024,
                      "rss_peak_mb": _proc_kb("VmHWM") / 1024,
                      "block_weights_mb": weights / 2**20}), flush=True)


def int8_copy(args, model_dir: Path) -> Path:
    """The int8 copy of float model dir ``model_dir`` in the cache (made with ``add_model(..., quantize="int8")``
    when the registry has none whose source is ``model_dir``)."""
    from node.compute.model import default_cache_dir
    from node.models import registry
    from node.models.convert import add_model

    cache = Path(args.model_cache) if args.model_cache else default_cache_dir()
    for e in registry.load(cache):
        if e.quantization == args.quantize and Path(e.source) == model_dir:
            return cache / e.dir
    ref = {"tiny-0": "tiny", "smollm2-135m": "smollm2"}.get(model_dir.name, str(model_dir))
    return cache / add_model(ref, cache, progress=True, quantize=args.quantize).dir


def bench_quantized(args, model_dir: Path, prompt: list[int]) -> None:
    """``--quantize``: float vs int8 tokens/s and resident memory, each variant in a fresh child process."""
    qdir = int8_copy(args, model_dir)
    print(f"int8 copy: {qdir}", flush=True)
    res = {}
    for label, d in [("float32", model_dir), ("int8", qdir), ("int8-dequantized", qdir)]:
        out = subprocess.run([sys.executable, __file__, "--mem-probe", label, "--model-dir", str(d), "--threads",
                              str(args.threads), "--tokens", str(args.tokens), "--runs", str(args.runs),
                              "--prompt-ids", json.dumps(prompt)], stdout=subprocess.PIPE, text=True, check=True,
                             cwd=Path(__file__).parents[1])
        res[label] = r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{label:17s} {r['tokens_s']:7.2f} tokens/s (runs {r['runs']}); RSS {r['rss_loaded_mb']:7.1f} MB loaded "
              f"(+{r['rss_loaded_mb'] - r['rss_base_mb']:.1f} over imports), peak {r['rss_peak_mb']:.1f} MB; block "
              f"weights {r['block_weights_mb']:.1f} MB", flush=True)
    f = res["float32"]
    for label in ("int8", "int8-dequantized"):
        r = res[label]
        same = next((i for i, (a, b) in enumerate(zip(r["tokens"], f["tokens"], strict=True)) if a != b),
                    len(f["tokens"]))
        print(f"{label} / float32: tokens/s x{r['tokens_s'] / f['tokens_s']:.2f}, RSS loaded "
              f"x{r['rss_loaded_mb'] / f['rss_loaded_mb']:.2f} (over imports "
              f"x{(r['rss_loaded_mb'] - r['rss_base_mb']) / (f['rss_loaded_mb'] - f['rss_base_mb']):.2f}), peak "
              f"x{r['rss_peak_mb'] / f['rss_peak_mb']:.2f}, block weights "
              f"x{r['block_weights_mb'] / f['block_weights_mb']:.2f}; first {same} of {len(f['tokens'])} greedy "
              "tokens equal the float model's", flush=True)


def resolve_model(args) -> Path:
    from node.compute.model import default_cache_dir, ensure_smollm2, make_tiny
    from node.models.lookup import model_dir_of

    cache = Path(args.model_cache) if args.model_cache else default_cache_dir()
    if args.model == "tiny":
        return make_tiny(cache, seed=0)
    if args.model == "smollm2":
        return ensure_smollm2(cache)
    return model_dir_of(args.model, cache)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--wan", action="store_true", help="also run through 25 ms-per-direction TCP relays")
    p.add_argument("--delay", type=float, default=0.025, help=argparse.SUPPRESS)
    p.add_argument("--compression", default="none", choices=["none", "fp16", "zstd", "fp16+zstd"])
    p.add_argument("--model", metavar="NAME",
                   help="smollm2, tiny, int8 (smollm2 and its int8 copy side by side: --quantize int8), or the name "
                        "or id of a model added with 'node model add' (e.g. a GGUF kept in its own quantization); "
                        "default: smollm2 (tiny with --redundancy 2)")
    p.add_argument("--servers", type=int, default=3,
                   help="span servers the model is split across (default and --processes; default: %(default)s)")
    p.add_argument("--quantize", choices=["int8"],
                   help="tokens/s and resident memory of the model and its int8 copy side by side, ratios printed")
    p.add_argument("--redundancy", type=int, default=1, choices=[1, 2],
                   help="2: tokens/s with redundancy 1 and 2 side by side (6 servers, two disjoint routes)")
    p.add_argument("--model-cache")
    p.add_argument("--threads", type=int, default=1)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--processes", action="store_true",
                      help="run each of the 3 servers as its own process (default: in the bench's own trio loop, "
                           "each with its own libp2p host and torch worker thread)")
    mode.add_argument("--hosts", action="store_true",
                      help="run each of the 3 servers and the client as its own process in its own Linux network "
                           "namespace on one bridge (traffic over veth, not loopback); needs root, iproute2 and "
                           "nftables (scripts/setup-netns)")
    p.add_argument("--nat", choices=["port", "random"],
                   help="with --hosts: real node processes, B, C (servers) and D (client) each behind a NAT "
                        "(port-preserving, or masquerade random) and A a public relay, against the same swarm on "
                        "loopback; prints time to first token / steady time per token and the tokens/s ratio "
                        "(bench/nat_swarm.py)")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--key", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--listen-host", default="127.0.0.1", help=argparse.SUPPRESS)
    p.add_argument("--client-of", help=argparse.SUPPRESS)
    p.add_argument("--mem-probe", help=argparse.SUPPRESS)
    p.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mem_probe:
        mem_probe(args)
        return
    if args.model == "int8":
        args.model, args.quantize = "smollm2", "int8"
    if args.quantize and (args.redundancy == 2 or args.hosts or args.wan or args.processes):
        p.error("--quantize runs in child processes of its own (not with --redundancy, --hosts, --wan, --processes)")
    if args.model is None:
        args.model = "tiny" if args.redundancy == 2 else "smollm2"
    if args.servers < 1 or (args.servers != 3 and (args.hosts or args.redundancy == 2)):
        p.error("--servers: at least 1, and only with the default or --processes (--hosts and --redundancy 2 "
                "run 3 servers)")
    if args.redundancy == 2 and (args.hosts or args.wan):
        p.error("--redundancy 2 runs on 127.0.0.1 only (not with --hosts or --wan)")
    if args.hosts and not (args.serve or args.client_of):
        if os.geteuid() != 0:
            p.error("--hosts builds Linux network namespaces and needs root (e.g. sudo .venv/bin/python "
                    "bench/inference.py --hosts); without root, use --processes")
        try:
            Netns("check").close()
        except NetnsUnavailable as e:
            p.error(f"--hosts: network namespaces are not available here: {e}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.nat:
        if not args.hosts:
            p.error("--nat needs --hosts")
        import nat_swarm  # bench/ is on sys.path when this file runs as a script

        nat_swarm.run(args, resolve_model(args))
        return
    if not (args.serve or args.client_of):  # the blob stores of the client and the servers (child processes
        import atexit  # too) go under one temp dir that is removed at exit
        import shutil

        root = tempfile.mkdtemp(prefix="tally-bench-")
        atexit.register(shutil.rmtree, root, True)
        os.environ["TMPDIR"] = tempfile.tempdir = root
    trio.run(serve if args.serve else client_of if args.client_of else bench, args)


if __name__ == "__main__":
    main()
