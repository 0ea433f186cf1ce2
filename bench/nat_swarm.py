"""``bench/inference.py --hosts --nat [port|random]`` (issue 25, check 2): a swarm behind home NATs against the same
swarm on loopback, with real ``node start`` processes.

Topology "nat" (Linux network namespaces, tests/net/netns.py): A public (validator, bootstrap peer, relay); B and C
serve the model's two halves and D is the client, each behind a NAT of its own whose router silently drops
unsolicited inbound TCP; ``port``: port-preserving masquerade (hole punching can work), ``random``: ``masquerade
random`` (it cannot: the route stays relayed). Every node listens on ``0.0.0.0:4001`` as in the README. Topology
"loopback": the same four nodes in one namespace on 127.0.0.1.

A driver in D's namespace (this file with ``--driver``) waits until D sees both spans, then times a one-token
generation through its API (the time to the first token after the swarm is covered: the call's wall time less what
followed the first token, ``seconds - first_token_s`` as the node reports them), waits (``port`` mode) until
D's connections to B and C are direct, and times generations of 1 and N tokens (the node's own ``seconds``): steady
time per token = (T_N - T_1) / (N - 1), median over runs. Printed: TTFT ÷ steady time per token (target <= 3), and
steady tokens/s ÷ loopback's (target >= 0.8 direct, >= 0.6 relayed), with each server's path and round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT_IDS = [1, 17, 42, 99, 7, 3, 250, 31]
START_TIMEOUT = 300.0  # seconds for a node process to write node.json (2 loaded cores, torch imports)


def _api(data_dir: Path):
    import httpx

    info = json.loads((data_dir / "node.json").read_text())
    token = (data_dir / "api_token").read_text().strip()
    return httpx.Client(base_url=info["api"], timeout=300.0, headers={"Authorization": f"Bearer {token}"})


def driver(data_dir: Path, tokens: int, runs: int, direct: list[str]) -> dict:
    """Child mode, inside D's namespace: the measurements described in the module doc, as a dict."""
    api = _api(data_dir)
    t0 = time.monotonic()
    while True:
        sw = api.get("/v1/swarm").json()
        if sw["covered"] == sw["num_blocks"] and len(sw["servers"]) >= 2:
            break
        if time.monotonic() - t0 > START_TIMEOUT:
            raise SystemExit(f"the swarm was not covered within {START_TIMEOUT} s: {sw}")
        time.sleep(0.05)
    covered_after = time.monotonic() - t0
    body = {"prompt_ids": PROMPT_IDS, "max_new_tokens": 1}
    t1 = time.monotonic()
    r = api.post("/v1/generate", json=body)
    while r.status_code == 503:  # an announcement lapsed between the coverage check and the request
        r = api.post("/v1/generate", json=body)
    r.raise_for_status()
    first_call_s = time.monotonic() - t1
    first = r.json()
    # to the first token: the request's wall time less what followed the first token (settling the sessions)
    ttft = first_call_s - (first["seconds"] - first["first_token_s"])
    route = [h["peer"] for h in r.json()["route"]]
    waited_direct = None
    if direct:
        t2 = time.monotonic()
        while True:
            rows = {p["peer"]: p for p in api.get("/v1/status").json()["network"]["peers"]}
            if all(rows.get(p, {}).get("path") == "direct" for p in direct):
                break
            if time.monotonic() - t2 > 180:
                break
            time.sleep(0.5)
        waited_direct = round(time.monotonic() - t2, 1)
    one, full = [], []
    for _ in range(runs):
        one.append(api.post("/v1/generate", json=body).json()["seconds"])
        g = api.post("/v1/generate", json={**body, "max_new_tokens": tokens}).json()
        full.append(g["seconds"])
    per_token = (statistics.median(full) - statistics.median(one)) / (tokens - 1)
    rows = {p["peer"]: p for p in api.get("/v1/status").json()["network"]["peers"]}
    return {"covered_after_s": round(covered_after, 2), "ttft_s": round(ttft, 3), "one_s": one, "full_s": full,
            "first_call_s": round(first_call_s, 3),
            "per_token_s": per_token, "tokens_s": 1.0 / per_token if per_token > 0 else float("inf"),
            "waited_direct_s": waited_direct,
            "paths": {p: {k: rows.get(p, {}).get(k) for k in ("path", "rtt_ms", "relay")} for p in route}}


def _ms(xs: list[float]) -> str:
    """``"a/b/c ms"`` of seconds."""
    return "/".join(f"{x * 1e3:.0f}" for x in xs) + " ms"


def _cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"node {' '.join(args)} failed: {r.stderr}")
    return r.stdout


def _topology(args, kind: str, model: str, cache: Path, spans: list[str]) -> dict:
    """Build one topology (``loopback`` or ``nat``), run the four nodes and the driver; returns its report."""
    from tests.net.netns import Netns
    from tests.net.tally import create_key

    tmp = Path(tempfile.mkdtemp(prefix=f"tally-nat-{kind}-"))
    with Netns(prefix_note=kind[:4]) as net:
        if kind == "loopback":
            lo = net.add_host("lo")
            hosts = {n: lo for n in "abcd"}
            listen = {n: f"/ip4/127.0.0.1/tcp/{4001 + i}" for i, n in enumerate("abcd")}
            boot_ip, boot_port = "127.0.0.1", 4001
        else:
            hosts = {"a": net.add_host("a")}
            for n in "bcd":
                hosts[n] = net.add_nat_host(n, stealth=True, random_ports=args.nat == "random")
            listen = {n: "/ip4/0.0.0.0/tcp/4001" for n in "abcd"}
            boot_ip, boot_port = hosts["a"].ip, 4001
        ids = {n: create_key(tmp / n) for n in "abcd"}
        genesis = tmp / "genesis.json"
        _cli("genesis", "new", "--chain-id", "tally-test-nat", "--params", "devnet", "--out", str(genesis),
             "--force", "--validator", f"{ids['a']}=200", "--account", f"{ids['b']}=100:200",
             "--account", f"{ids['c']}=100:200", "--account", f"{ids['d']}=1000",
             "--bootstrap", f"/ip4/{boot_ip}/tcp/{boot_port}/p2p/{ids['a']}")
        procs = {}
        started = time.monotonic()
        for n, extra in (("a", []), ("b", ["--span", spans[0]]), ("c", ["--span", spans[1]]), ("d", [])):
            with open(tmp / f"{n}.log", "ab") as log:  # the child keeps its own descriptor
                procs[n] = net.popen(hosts[n], [sys.executable, "-m", "node.cli", "start", "--data-dir",
                                                str(tmp / n), "--genesis", str(genesis), "--listen", listen[n],
                                                "--model", model, "--model-cache", str(cache), "--api-port", "0",
                                                *extra, *(["--log-level", "DEBUG"] if n == "d" and
                                                          os.environ.get("TALLY_BENCH_DEBUG") else [])],
                                     stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={"PYTHONUNBUFFERED": "1"})
            deadline = time.monotonic() + START_TIMEOUT
            while not (tmp / n / "node.json").exists():
                if procs[n].poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{n} did not start:\n{(tmp / f'{n}.log').read_text()[-3000:]}")
                time.sleep(0.2)
        want = [ids["b"], ids["c"]] if kind == "nat" and args.nat == "port" else []
        r = net.run(hosts["d"], [sys.executable, str(Path(__file__).resolve()), "--driver", str(tmp / "d"),
                                 "--tokens", str(args.tokens), "--runs", str(args.runs), "--direct", ",".join(want)],
                    timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"driver failed in {kind}: {r.stderr[-3000:]}\n{r.stdout[-2000:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        hold = float(os.environ.get("TALLY_BENCH_HOLD", "0")) if kind == "nat" else 0.0  # check 3
        t_end = time.monotonic() + hold
        while time.monotonic() < t_end:
            time.sleep(min(60.0, max(0.0, t_end - time.monotonic())))
            g = net.run(hosts["d"], [sys.executable, str(ROOT / "tests/net/api_call.py"), str(tmp / "d"), "POST",
                                     "/v1/generate", json.dumps({"prompt_ids": PROMPT_IDS, "max_new_tokens": 8})],
                        timeout=300)
            out.setdefault("held_generations", []).append(g.returncode == 0)
        out["uptime_s"] = round(time.monotonic() - started, 1)
        errors = [ln for n in "abcd" for ln in (tmp / f"{n}.log").read_text(errors="replace").splitlines()
                  if " ERROR " in ln]
        out["error_lines"] = len(errors)
        out["errors"] = errors[:5]
        out["names"] = {ids[n]: n.upper() for n in "abcd"}
        return out


def run(args, model_dir: Path) -> None:
    """Parent mode (``bench/inference.py --hosts --nat``): both topologies, then the report."""
    from node.compute.model import load_manifest

    nb = load_manifest(model_dir).num_blocks
    spans = [f"0:{nb // 2}", f"{nb // 2}:{nb}"]
    model = "tiny" if args.model == "tiny" else "smollm2"
    cache = model_dir.parent
    res = {k: _topology(args, k, model, cache, spans) for k in ("loopback", "nat")}
    lo, nat = res["loopback"], res["nat"]
    print(f"--hosts --nat {args.nat}: model {model}, {args.tokens} tokens x {args.runs} runs; A public relay, "
          f"B, C, D each behind a silent-drop NAT ({'port-preserving' if args.nat == 'port' else 'masquerade random'})")
    for k, r in res.items():
        paths = ", ".join(f"{r['names'].get(p, p[:8])} {v['path']} rtt {v['rtt_ms'] and round(v['rtt_ms'], 1)} ms"
                          for p, v in r["paths"].items())
        print(f"  {k:8}: covered {r['covered_after_s']} s after D's API was up; first token {r['ttft_s']:.3f} s "
              f"(whole first call {r['first_call_s']:.3f} s; warm 1-token calls {_ms(r['one_s'])}); "
              f"steady {r['per_token_s'] * 1e3:.1f} ms/token = {r['tokens_s']:.2f} tokens/s; paths: {paths}; "
              f"ERROR lines {r['error_lines']}"
              + (f"; direct after {r['waited_direct_s']} s" if r.get("waited_direct_s") is not None else "")
              + f"; nodes up {r['uptime_s']} s" + (f", generations while held: {r['held_generations']}"
                                                    if r.get("held_generations") else ""))
        for e in r["errors"]:
            print(f"    {e}")
    target = 0.8 if args.nat == "port" else 0.6
    print(f"  time to first token / steady time per token (NAT): {nat['ttft_s'] / nat['per_token_s']:.2f} "
          f"(target <= 3); on loopback: {lo['ttft_s'] / lo['per_token_s']:.2f}")
    print(f"  steady tokens/s, NAT / loopback: {nat['tokens_s'] / lo['tokens_s']:.3f} (target >= {target})")


def main() -> None:
    p = argparse.ArgumentParser(description="driver of bench/inference.py --hosts --nat (runs in D's namespace)")
    p.add_argument("--driver", type=Path, required=True)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--direct", default="")
    a = p.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(json.dumps(driver(a.driver, a.tokens, a.runs, [x for x in a.direct.split(",") if x])))


if __name__ == "__main__":
    main()
