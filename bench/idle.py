"""What an idle Tally network costs: CPU-seconds per minute and gossip per minute of idle `node start` processes.

Starts, as separate processes on 127.0.0.1 (as ``node devnet`` and the process tests do), one validator (dev key
0, no span) and ``--servers`` tiny-model span servers, waits until every node is up and ``--settle`` seconds more,
then watches them for ``--seconds`` with no client traffic and prints, per process: CPU-seconds per minute
(utime + stime from ``/proc/<pid>/stat``, whole process, all threads) and gossip items sent per minute by kind and
topic (``/metrics``: ``tally_gossip_sent_total``, :class:`node.p2p.gossip.GossipCounts`), plus the blocks made
per minute.

Each configuration in ``--configs`` is one genesis (same keys, new network) run after the other in this one
invocation, and the last lines give the ratio of each to the first:

* ``before``: block time 200 ms and ``heartbeat_ms`` 0, as the process tests' genesis had it
  (``tests/inference/procs.py``): a block every 200 ms, idle or not;
* ``devnet``: the embedded devnet's parameters (``genesis/devnet.json``, block time 500 ms);
* ``quiet``: block time 200 ms with ``heartbeat_ms`` ``--heartbeat-ms`` (default 2000): blocks only when
  something is due (:mod:`node.ledger.core.liveness`).

Usage: ``.venv/bin/python bench/idle.py [--seconds 60] [--servers 2] [--configs before,quiet] [--keep DIR]``.
The machine's load changes what a CPU-second buys; compare configurations of one run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from node.compute.model import make_tiny
from node.identity import Identity, dev_seed

ROOT = Path(__file__).resolve().parents[1]
CLK = os.sysconf("SC_CLK_TCK")
HEIGHT = re.compile(r'^tally_block_height ([0-9.e+]+)$', re.M)
SENT = re.compile(r'^tally_gossip_sent_total\{kind="([^"]+)"\} ([0-9.e+]+)$', re.M)


def peer(key: int) -> str:
    return Identity.from_seed(dev_seed(key)).peer_id


def params_for(config: str, heartbeat_ms: int) -> dict:
    """Genesis parameters of one configuration (module docstring)."""
    if config == "before":
        return {"block_time_ms": 200, "verdict_timeout": 15}
    if config == "quiet":
        return {"block_time_ms": 200, "verdict_timeout": 15, "heartbeat_ms": heartbeat_ms}
    if config == "devnet":
        return dict(json.loads((ROOT / "genesis" / "devnet.json").read_text())["params"])
    raise ValueError(f"unknown config {config!r}; expected before, quiet or devnet")


def write_genesis(path: Path, servers: int, params: dict) -> Path:
    accounts = [{"account": peer(0), "balance": "1000"}]
    accounts += [{"account": peer(k), "balance": "100", "bond": "200"} for k in range(1, servers + 1)]
    path.write_text(json.dumps({"chain_id": "tally-test-idle", "validators": [peer(0)], "accounts": accounts,
                                "params": params}))
    return path


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` in seconds (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def scrape(api: str) -> tuple[int, dict[str, float]]:
    """The node at ``api``: its ledger height and ``tally_gossip_sent_total`` by kind (``publish:consensus``,
    ``ihave:shards``...), from ``/metrics``."""
    text = httpx.get(f"{api}/metrics", timeout=10).text
    return int(float(HEIGHT.search(text).group(1))), {k: float(v) for k, v in SENT.findall(text)}


def start(tmp: Path, key: int, genesis: Path, cache: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    d = tmp / f"p{key}"
    d.mkdir(parents=True, exist_ok=True)
    log = open(d / "stdout.log", "ab")  # noqa: SIM115 - the child's log, open for its life
    proc = subprocess.Popen([sys.executable, "-m", "node.cli", "start", "--data-dir", str(d), "--model", "tiny",
                             "--model-cache", str(cache), "--api-port", "0", "--genesis", str(genesis),
                             "--dev-account", str(key), *extra],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return proc, d


def wait_info(d: Path, proc: subprocess.Popen, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{d} exited: {(d / 'stdout.log').read_text()[-2000:]}")
        if (d / "node.json").exists():
            return json.loads((d / "node.json").read_text())
        time.sleep(0.2)
    raise TimeoutError(f"{d} did not start within {timeout} s")


def measure(tmp: Path, config: str, servers: int, seconds: float, settle: float, heartbeat_ms: int) -> dict:
    """Run one configuration; returns ``{"blocks": per minute, "nodes": [(name, cpu-s/min, {kind: per min})]}``."""
    cache = tmp / "models"
    model_dir = make_tiny(cache, 0)
    blocks = json.loads((model_dir / "manifest.json").read_text()).get("num_blocks", servers)
    run = tmp / config
    run.mkdir(parents=True)
    genesis = write_genesis(run / "genesis.json", servers, params_for(config, heartbeat_ms))
    procs: list[tuple[str, subprocess.Popen, dict]] = []
    try:
        p0, d0 = start(run, 0, genesis, cache)
        i0 = wait_info(d0, p0)
        procs.append(("validator", p0, i0))
        per = max(1, blocks // servers)
        started = []
        for k in range(1, servers + 1):
            a, b = min((k - 1) * per, blocks - 1), (k * per if k < servers else blocks)
            started.append((k, *start(run, k, genesis, cache, "--span", f"{a}:{b}", "--bootstrap", i0["addrs"][0])))
        for k, p, d in started:
            procs.append((f"server {k}", p, wait_info(d, p)))
        time.sleep(settle)
        before = [(cpu_seconds(p.pid), *scrape(i["api"])) for _n, p, i in procs]
        t0 = time.monotonic()
        time.sleep(seconds)
        after = [(cpu_seconds(p.pid), *scrape(i["api"])) for _n, p, i in procs]
        minutes = (time.monotonic() - t0) / 60
        nodes = []
        for (name, _p, _i), (c0, _h0, g0), (c1, _h1, g1) in zip(procs, before, after, strict=True):
            rates = {k: (g1.get(k, 0) - g0.get(k, 0)) / minutes for k in g1}
            nodes.append((name, (c1 - c0) / minutes, {k: v for k, v in rates.items() if v}))
        return {"blocks": (after[0][1] - before[0][1]) / minutes, "nodes": nodes}
    finally:
        for _n, p, _i in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _n, p, _i in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def report(config: str, r: dict) -> str:
    lines = [f"{config}: {r['blocks']:.0f} blocks/min, load {os.getloadavg()[0]:.1f}"]
    for name, cpu, rates in r["nodes"]:
        top = ", ".join(f"{k} {v:.0f}" for k, v in sorted(rates.items(), key=lambda kv: -kv[1])[:6])
        lines.append(f"  {name:9s} {cpu:6.2f} CPU-s/min  gossip sent/min {sum(rates.values()):6.0f}  ({top})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle window watched per configuration (default 60)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after every node is up before watching")
    ap.add_argument("--servers", type=int, default=2, help="tiny-model span servers (default 2)")
    ap.add_argument("--configs", default="before,quiet", help="comma-separated: before, quiet, devnet")
    ap.add_argument("--heartbeat-ms", type=int, default=2000, help="heartbeat_ms of the quiet config (default 2000)")
    ap.add_argument("--keep", type=Path, help="keep the nodes' data dirs and logs here")
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        params_for(c, args.heartbeat_ms)  # refuse an unknown name before starting anything
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="tally-idle-"))
    results = {}
    for c in configs:
        results[c] = measure(tmp, c, args.servers, args.seconds, args.settle, args.heartbeat_ms)
        print(report(c, results[c]), flush=True)
    base = results[configs[0]]
    for c in configs[1:]:
        r = results[c]
        ratios = ", ".join(f"{n} {cpu / b:.2f}"
                           for (n, cpu, _), (_, b, _) in zip(r["nodes"], base["nodes"], strict=True) if b)
        sent = sum(sum(x.values()) for *_, x in r["nodes"]) / max(1e-9, sum(sum(x.values()) for *_, x in
                                                                             base["nodes"]))
        print(f"{c} / {configs[0]}: CPU-s per idle minute {ratios}; gossip items sent {sent:.3f}")


if __name__ == "__main__":
    main()
