"""How fast a node starts: seconds from ``node start`` to its HTTP API and to its first block (issue 35).

Each configuration spawns ``python -m node.cli start`` on the embedded devnet genesis as a lone validator (dev key
0, no ``--bootstrap``) in a fresh temporary data dir, listening on 127.0.0.1 on free ports (``--api-port 0``; the
devnet's libp2p default), and polls ``GET /v1/status`` every 20 ms once ``node.json`` names its API. It prints,
per configuration, the median over ``--runs`` of

* ``api``: seconds until ``/v1/status`` first answers (the node has built its services, loaded its span and warmed
  its head where it has them: it is ready to serve);
* ``block``: seconds from the spawn to the first block: block 1's header time (``GET /v1/blocks/1``, the validator's
  clock when it proposed it; same machine) minus the wall-clock time of the spawn. The ledger may make it before
  the API opens (a span is loaded while the chain runs);
* ``cpu``: the node process's CPU-seconds (user + system, ``/proc/<pid>/stat``, all threads) when the API first
  reports height >= 1. On a loaded machine the wall-clock figures grow with the load while this one does not: a
  start is mostly one busy thread (imports, then building the node), so it is about what a start takes on a quiet
  machine.

Configurations (``--configs``):

* ``validator``: no model loaded: ``--model tiny --lazy-head`` and no ``--span`` (every node names a model; this one
  loads none of its weights, builds no client head and serves nothing). Target (issue 35): block <= 2 s;
* ``tiny``: the tiny test Llama (6 blocks, hidden 64; ``tests/inference/conftest.py``) served whole
  (``--span all``), with its client head warmed at start (the default). Target: block <= 4 s.

The first block a lone devnet validator makes is due at once (the genesis time is in the past and a chain's first
block is its proof block, :mod:`node.ledger.core.liveness`): ``block`` is the time to a running ledger.

Then the import cost of the node's composition root: ``python -X importtime -c "import node.runtime"``, its total
and the heaviest third-party packages it pulls in, and whether torch, transformers or peft got imported.

``--against DIR`` runs every configuration from another checkout too (e.g. ``git worktree add /tmp/before HEAD~1``;
same interpreter, ``DIR`` on ``sys.path`` first), alternating run by run, and prints the ratio this / DIR: compare
figures of one invocation, as the machine's load changes them between runs.

Usage: ``.venv/bin/python bench/startup.py [--runs 5] [--configs validator,tiny] [--against DIR] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from node.compute.model import default_cache_dir, make_tiny

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "validator": ("--lazy-head",),
    "tiny": ("--span", "all"),
}
TARGETS = {"validator": 2.0, "tiny": 4.0}  # issue 35, check 3: seconds to the first block on a quiet machine
HEAVY = ("torch", "transformers", "peft", "safetensors", "libp2p", "fastapi", "numpy", "hypercorn", "jinja2",
         "plyvel", "nacl", "cryptography", "zstandard", "httpx", "multiaddr")
CLK = os.sysconf("SC_CLK_TCK")
LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` in seconds (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def start_once(repo: Path, config: str, cache: Path, tmp: Path, timeout: float) -> tuple[float, float, float]:
    """One ``node start`` from checkout ``repo``; returns (seconds to the API, seconds to block 1, the node's
    CPU-seconds when the API reports it)."""
    data = Path(tempfile.mkdtemp(prefix=f"{config}-", dir=tmp))
    cmd = [sys.executable, "-m", "node.cli", "start", "--data-dir", str(data), "--model", "tiny", "--model-cache",
           str(cache), "--api-port", "0", "--dev-account", "0", *CONFIGS[config]]  # ports 0: any free ones
    env = {**os.environ, "PYTHONPATH": str(repo)}
    t_api = None
    with open(data / "stdout.log", "wb") as log:
        t0, wall0 = time.perf_counter(), time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=repo, env=env)
        try:
            with httpx.Client(timeout=2.0) as http:
                while time.perf_counter() - t0 < timeout:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{config}: node exited {proc.returncode}: "
                                           f"{(data / 'stdout.log').read_text()[-2000:]}")
                    try:  # node.json names the API once it listens
                        api = json.loads((data / "node.json").read_text())["api"]
                        height = http.get(f"{api}/v1/status").json()["height"]
                    except (OSError, ValueError, KeyError, httpx.HTTPError):
                        time.sleep(0.02)
                        continue
                    now = time.perf_counter() - t0
                    t_api = now if t_api is None else t_api
                    if height >= 1:
                        cpu = cpu_seconds(proc.pid)
                        block1 = http.get(f"{api}/v1/blocks/1").json()["time_ms"] / 1000
                        return t_api, block1 - wall0, cpu
                    time.sleep(0.02)
            raise TimeoutError(f"{config}: no block within {timeout} s ({data / 'stdout.log'})")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def import_profile(repo: Path) -> tuple[float, list[tuple[str, float]], list[str]]:
    """``import node.runtime`` in a fresh interpreter from ``repo``: its total seconds (``-X importtime``'s
    cumulative figure), the heaviest third-party packages (seconds, each counted where first imported) and which of
    torch, transformers and peft it imported."""
    code = "import sys, node.runtime; print(','.join(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, cwd=repo,
                         env={**os.environ, "PYTHONPATH": str(repo)}, check=True)
    total, packages = 0.0, {}
    for line in out.stderr.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, cumulative = m.group(4), int(m.group(2)) / 1e6
        if name == "node.runtime":
            total = cumulative
        if name in HEAVY and name not in packages:
            packages[name] = cumulative
    heavy = sorted(packages.items(), key=lambda kv: -kv[1])
    return total, heavy, [m for m in out.stdout.strip().split(",") if m]


def describe_imports(label: str, repo: Path) -> str:
    total, heavy, loaded = import_profile(repo)
    top = ", ".join(f"{n} {s:.2f}" for n, s in heavy[:6])
    return (f"{label}: import node.runtime {total:.2f} s; imports {', '.join(loaded) or 'no torch/transformers/peft'}; "
            f"heaviest packages (s, where first imported): {top}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="starts per configuration and checkout (default 5)")
    ap.add_argument("--configs", default="validator,tiny", help=f"comma-separated: {', '.join(CONFIGS)}")
    ap.add_argument("--against", type=Path, help="another checkout (e.g. a git worktree of the commit before) to "
                                                 "run the same starts from, alternating, for a ratio")
    ap.add_argument("--model-cache", type=Path, help="where the tiny model is built once (default: "
                                                     "$TALLY_MODEL_CACHE or ~/.cache/tally/models)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one start may take (default 120)")
    ap.add_argument("--keep", type=Path, help="keep the nodes' data dirs and logs here")
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r}; expected {', '.join(CONFIGS)}")
    cache = args.model_cache or default_cache_dir()
    make_tiny(cache, seed=0)  # built once, outside the timed starts
    repos = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="tally-startup-"))
    tmp.mkdir(parents=True, exist_ok=True)
    times: dict[tuple[str, str], list[tuple[float, float, float]]] = {(r, c): [] for r in repos for c in configs}
    try:
        for _ in range(args.runs):
            for c in configs:
                for r, repo in repos.items():
                    times[r, c].append(start_once(repo, c, cache, tmp, args.timeout))
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"node start on the devnet, one validator, median of {args.runs} (load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs):")
    for r, repo in repos.items():
        for c in configs:
            api, block, cpu = (statistics.median(t[i] for t in times[r, c]) for i in range(3))
            every = " ".join(f"{t[1]:.2f}" for t in times[r, c])
            print(f"  {r:7s} {c:9s} api {api:5.2f} s  first block {block:5.2f} s (target {TARGETS[c]:.0f} s; "
                  f"runs {every})  cpu {cpu:5.2f} s  [{repo}]")
    if args.against:
        for c in configs:
            api, block, cpu = (statistics.median(t[i] for t in times["this", c]) /
                               statistics.median(t[i] for t in times["against", c]) for i in range(3))
            print(f"  {c}: this / against: first block {block:.2f}, api {api:.2f}, cpu {cpu:.2f}")
    for r, repo in repos.items():
        print(describe_imports(f"{r:7s}", repo))


if __name__ == "__main__":
    main()
