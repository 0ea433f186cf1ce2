"""Tally nodes on namespace hosts, set up as a user would: ``node key --create``, ``node genesis new``, ``node
start --genesis FILE --listen ...`` in each host (test infra only; see :mod:`tests.net.netns`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .netns import Host, Netns

ROOT = Path(__file__).resolve().parents[2]
PORT = 4001


def cli(*args: str, timeout: float = 60.0) -> str:
    """Run ``node ARGS`` here (no network needed) and return its stdout; raise with its stderr on failure."""
    r = subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    if r.returncode != 0:
        raise AssertionError(f"node {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def create_key(data_dir: Path) -> str:
    """``node key --create``: the data dir's peer ID."""
    out = cli("key", "--data-dir", str(data_dir), "--create").strip().splitlines()
    return next(w for line in out for w in line.split() if w.startswith("12D3KooW"))


@dataclass
class TallyNode:
    name: str
    host: Host
    data_dir: Path
    peer_id: str
    proc: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def addr(self) -> str:
        """Its direct multiaddr (meaningful for public hosts)."""
        return f"/ip4/{self.host.ip}/tcp/{PORT}/p2p/{self.peer_id}"

    def info(self) -> dict:
        return json.loads((self.data_dir / "node.json").read_text())


class TallyNet:
    """Builds and runs a Tally network on ``net``'s hosts.

    Args:
        net: the :class:`Netns`.
        tmp: a temp dir (data dirs, logs, the genesis file).
        model_cache: the model cache holding the tiny model.
    """

    def __init__(self, net: Netns, tmp: Path, model_cache: Path):
        self.net, self.tmp, self.cache = net, tmp, model_cache
        self.nodes: dict[str, TallyNode] = {}
        self.genesis: Path | None = None

    def add(self, name: str, nat: bool = False) -> TallyNode:
        host = self.net.add_nat_host(name) if nat else self.net.add_host(name)
        d = self.tmp / name
        node = TallyNode(name, host, d, create_key(d))
        self.nodes[name] = node
        return node

    def make_genesis(self, validators: list[str], servers: list[str], clients: list[str], bootstrap: list[str],
                     chain_id: str = "tally-test-net", params: dict | None = None,
                     path: Path | None = None) -> Path:
        """``node genesis new`` with devnet parameters; validators and servers bonded, clients funded."""
        path = path or self.tmp / "genesis.json"
        args = ["genesis", "new", "--chain-id", chain_id, "--params", "devnet", "--out", str(path), "--force"]
        for v in validators:
            args += ["--validator", f"{self.nodes[v].peer_id}=200"]
        for s in servers:
            args += ["--account", f"{self.nodes[s].peer_id}=100:200"]
        for c in clients:
            args += ["--account", f"{self.nodes[c].peer_id}=1000"]
        for b in bootstrap:
            args += ["--bootstrap", self.nodes[b].addr]
        for k, v in (params or {}).items():
            args += ["--param", f"{k}={v}"]
        cli(*args)
        return path

    def start(self, name: str, *extra: str, genesis: Path | None = None) -> TallyNode:
        """``node start`` in the node's host, listening on its address, TCP 4001."""
        node = self.nodes[name]
        node.log = self.tmp / f"{name}.log"
        argv = [sys.executable, "-m", "node.cli", "start", "--data-dir", str(node.data_dir),
                "--genesis", str(genesis or self.genesis), "--listen", f"/ip4/{node.host.ip}/tcp/{PORT}",
                "--model", "tiny", "--model-cache", str(self.cache), "--api-port", "0", *extra]
        with open(node.log, "ab") as f:
            node.proc = self.net.popen(node.host, argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                       env={"PYTHONUNBUFFERED": "1"})
        return node

    def stop(self, name: str) -> None:
        p = self.nodes[name].proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def wait_up(self, name: str, timeout: float = 90.0) -> dict:
        """Wait until the node has written ``node.json`` (listening, API up); returns it."""
        node = self.nodes[name]
        deadline = time.monotonic() + timeout
        path = node.data_dir / "node.json"
        while time.monotonic() < deadline:
            if node.proc is not None and node.proc.poll() is not None:
                raise AssertionError(f"{name} exited with {node.proc.returncode}:\n{self.tail(name)}")
            if path.exists():
                info = node.info()
                if info.get("pid") == node.proc.pid:
                    return info
            time.sleep(0.2)
        raise AssertionError(f"{name} not up within {timeout} s:\n{self.tail(name)}")

    def api(self, name: str, method: str, path: str, body: dict | None = None, timeout: float = 150.0):
        """Call ``name``'s HTTP API from inside its host; returns the decoded JSON."""
        node = self.nodes[name]
        argv = [sys.executable, str(ROOT / "tests/net/api_call.py"), str(node.data_dir), method, path]
        if body is not None:
            argv.append(json.dumps(body))
        r = self.net.run(node.host, argv, timeout=timeout)
        if r.returncode != 0:
            raise AssertionError(f"{name} {method} {path}: {r.stdout}{r.stderr}\n"
                                 + "\n".join(f"--- {n}\n{self.tail(n)}" for n in self.nodes))
        return json.loads(r.stdout)

    def wait(self, what, timeout: float, every: float = 0.5, why: str = ""):
        """Poll ``what()`` until it returns something truthy; returns it."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = what()
            except AssertionError as e:
                last = e
            else:
                if last:
                    return last
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout} s waiting for {why or what}: last {last!r}\n"
                             + "\n".join(f"--- {n}\n{self.tail(n)}" for n in self.nodes))

    def tail(self, name: str, lines: int = 40) -> str:
        log = self.nodes[name].log
        if log is None or not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
