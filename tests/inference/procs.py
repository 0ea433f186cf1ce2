"""Helpers for process-level inference tests: a test genesis, in-process nodes and `node start` processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import trio

from node.config import NodeConfig
from node.identity import Identity, dev_seed
from node.ledger.genesis import load_genesis
from node.net.service import NetworkService
from node.runtime import Node

ROOT = Path(__file__).resolve().parents[2]


def peer(key: int) -> str:
    return Identity.from_seed(dev_seed(key)).peer_id


def write_genesis(tmp: Path, servers: list[int], clients: list[int], **params) -> Path:
    """Dev key 0 validates (and may be a client); ``servers`` are bonded; ``clients`` are funded."""
    accounts = [{"account": peer(0), "balance": "1000"}]  # genesis amounts are decimal credits
    accounts += [{"account": peer(k), "balance": "100", "bond": "200"} for k in servers]
    accounts += [{"account": peer(k), "balance": "1000"} for k in clients if k != 0]
    path = tmp / "genesis.json"
    path.write_text(json.dumps({"chain_id": "tally-test-inference", "validators": [peer(0)], "accounts": accounts,
                                "params": {"block_time_ms": 200, "verdict_timeout": 15, **params}}))
    return path


def config(tmp: Path, key: int, genesis_file: Path, model_dir: Path, span=None, **kw) -> NodeConfig:
    return NodeConfig(data_dir=tmp / f"n{key}", genesis=load_genesis(genesis_file), model_dir=model_dir, span=span,
                      seed=dev_seed(key), step_timeout=kw.pop("step_timeout", 10.0),
                      announce_period=kw.pop("announce_period", 0.5), **kw)


async def start_nodes(nursery, cfgs: list[NodeConfig]) -> list[Node]:
    nodes = [Node(c) for c in cfgs]
    for nd in nodes:
        nursery.start_soon(nd.run)
    for nd in nodes:
        await nd.started.wait()
    return nodes


def spawn(tmp: Path, key: int, genesis_file: Path, cache: Path, *extra: str, model: str = "tiny") -> subprocess.Popen:
    """``node start`` with dev key ``key`` on the test chain and ``model`` (``tiny`` or ``smollm2``, from the model
    cache ``cache``), as its own process; its output goes to ``tmp/p<key>/stdout.log``."""
    d = tmp / f"p{key}"
    d.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "node.cli", "start", "--data-dir", str(d), "--model", model,
                             "--model-cache", str(cache), "--api-port", "0", "--genesis", str(genesis_file),
                             "--dev-account", str(key), *extra],
                            stdout=open(d / "stdout.log", "ab"), stderr=subprocess.STDOUT, cwd=ROOT)


async def wait_live(node: Node, n: int, timeout: float = 60.0) -> None:
    """Until ``node`` has heard ``n`` live span announcements."""
    with trio.fail_after(timeout):
        while len(node.swarm.live(node.manifest.model_id)) < n:
            await trio.sleep(0.1)


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def stop_all(procs) -> None:
    for p in procs:
        kill(p, signal.SIGKILL)
    for p in procs:
        with suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def wait_exit(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)


@asynccontextmanager
async def light_client(tmp: Path, key: int, model_dir: Path, via: Node, step_timeout: float = 10.0):
    """A client that is only a libp2p host and a RouteClient (no ledger of its own): dev key ``key``, connected
    to ``via`` (whose ledger gives the chain parameters), waiting up to ``step_timeout`` seconds for a stream or a
    step's answer. Receipts are left to the servers to submit."""
    from node.blobs import BlobStore
    from node.compute.executor import TorchExecutor
    from node.compute.head import ClientHead
    from node.inference.client import RouteClient
    from node.inference.swarm import SwarmTable
    from node.p2p.host import P2PHost

    ident = Identity.from_seed(dev_seed(key))
    host = P2PHost(ident, 0, via.genesis.chain_id, genesis_hash=via.genesis.hash)
    net = NetworkService(host, via.genesis.hash)  # the genesis handshake every node insists on
    swarm = SwarmTable()
    async with host.running():
        await host.start_service(net.run)
        await host.subscribe(host.topic("shards"), swarm.on_announcement)
        await host.connect(via.host.addrs)
        (tmp / f"c{key}").mkdir(parents=True, exist_ok=True)
        yield RouteClient(ident, host, ClientHead(model_dir), via.manifest, via.ledger, TorchExecutor(1),
                          BlobStore(tmp / f"c{key}"), swarm, step_timeout=step_timeout, submit=False,
                          open_timeout=step_timeout)


async def wait_swarm(swarm, model_dir: Path, n: int, timeout: float = 60.0) -> None:
    from node.compute.model import load_manifest

    mid = load_manifest(model_dir).model_id
    with trio.fail_after(timeout):
        while len(swarm.live(mid)) < n:
            await trio.sleep(0.1)


@asynccontextmanager
async def light_server(tmp: Path, key: int, model_dir: Path, span: tuple[int, int], via: Node,
                       step_timeout: float = 10.0, announce_period: float = 1.0):
    """A span server without a ledger of its own: a libp2p host, a SpanServer and a committee member that use
    ``via``'s ledger (same process) for the height, for submitting receipts and votes and for committee duty.
    Ten full nodes in one trio loop on two cores starve each other; this keeps every wire protocol real."""
    from node.blobs import BLOB_PROTOCOL, BlobStore
    from node.compute.executor import TorchExecutor
    from node.compute.span import SpanModel
    from node.inference.server import INFERENCE_PROTOCOL, SpanServer, blob_handler
    from node.p2p.host import P2PHost
    from node.verify.member import CommitteeMember

    ident = Identity.from_seed(dev_seed(key))
    host = P2PHost(ident, 0, via.genesis.chain_id, genesis_hash=via.genesis.hash)
    net = NetworkService(host, via.genesis.hash)
    blobs = BlobStore(tmp / f"l{key}")
    ex = TorchExecutor(1)
    server = SpanServer(ident, via.genesis.domain, SpanModel(model_dir, *span), ex, blobs,
                        lambda: via.ledger.state.height, via.genesis.params.price_per_token_block,
                        step_timeout=step_timeout, submit=via.ledger.submit, penalize=host.penalize)
    member = CommitteeMember(ident, via.ledger, host, blobs, ex, lambda s, e: SpanModel(model_dir, s, e),
                             via.manifest.model_id)
    via.ledger.on_block(member.on_block)
    host.set_handler(INFERENCE_PROTOCOL, server.handle)
    host.set_handler(BLOB_PROTOCOL, lambda stream, peer: blob_handler(blobs, stream, peer))
    async with host.running(), trio.open_nursery() as n:
        await host.start_service(net.run)
        await host.connect(via.host.addrs)
        await server.measure()
        n.start_soon(server.announce_loop, host, announce_period)
        n.start_soon(member.run)
        yield server
        n.cancel_scope.cancel()


def wait_info(tmp: Path, key: int, proc: subprocess.Popen, timeout: float = 120.0) -> dict:
    """Until the ``spawn``-ed node of dev key ``key`` has written its ``node.json`` (listening, API up); returns it.
    Fails at once, with the end of its log, if the process exits."""
    d = tmp / f"p{key}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"node {key} exited {proc.returncode}:\n{tail(tmp, key)}"
        path = d / "node.json"
        if path.exists():
            info = json.loads(path.read_text())
            if info.get("pid") == proc.pid:
                return info
        time.sleep(0.2)
    raise AssertionError(f"node {key} not up within {timeout} s:\n{tail(tmp, key)}")


def tail(tmp: Path, key: int, lines: int = 40) -> str:
    """The last ``lines`` lines of the ``spawn``-ed node's output (tracebacks' indented lines left out)."""
    log = tmp / f"p{key}" / "stdout.log"
    if not log.exists():
        return "(no log)"
    return "\n".join([x for x in log.read_text(errors="replace").splitlines() if not x.startswith("  ")][-lines:])


def api_get(info: dict, path: str, missing_ok: bool = False):
    """GET ``path`` from the node's HTTP API (``info`` from :func:`wait_info`): the JSON, or None for a 404 when
    ``missing_ok``."""
    import httpx

    r = httpx.get(info["api"] + path, timeout=30.0)
    if r.status_code == 404 and missing_ok:
        return None
    r.raise_for_status()
    return r.json()


def metric(info: dict, name: str) -> float:
    """The value of the unlabelled Prometheus sample ``name`` on the node's ``/metrics``."""
    import httpx

    text = httpx.get(info["api"] + "/metrics", timeout=30.0).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def wait_final_api(info: dict, rids: list[str], timeout: float = 120.0) -> dict[str, dict]:
    """Until every receipt of ``rids`` (hex ids) is on the node's ledger with a final status (valid, invalid,
    settled, unverified); returns id -> the API's receipt JSON."""
    from node.ledger.core.status import FINAL

    deadline = time.monotonic() + timeout
    recs: dict[str, dict | None] = {}
    while time.monotonic() < deadline:
        recs = {r: api_get(info, f"/v1/receipts/{r}", missing_ok=True) for r in rids}
        if all(x is not None and x["status"] in FINAL for x in recs.values()):
            return recs
        time.sleep(0.5)
    raise AssertionError(f"receipts not final within {timeout} s: "
                         f"{ {r[:12]: x and (x['status'], x['round'], x['votes']) for r, x in recs.items()} }")


def balance(info: dict, key: int) -> int:
    """Dev key ``key``'s balance on the node's ledger, base units."""
    return int(api_get(info, f"/v1/accounts/{peer(key)}")["balance"]["base_units"])


class Lines:
    """The stdout lines of a process, read by a daemon thread so that a test can wait for one with a timeout."""

    def __init__(self, proc: subprocess.Popen, log: Path):
        import queue
        import threading

        self.proc, self.log, self.seen = proc, log, []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, prefix: str, timeout: float) -> str:
        """The next line starting with ``prefix`` (earlier lines are kept in :attr:`seen`); fails with the
        process's stderr log if it ends or ``timeout`` seconds pass first."""
        import queue

        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
                raise AssertionError(f"no {prefix!r} line within {timeout} s (exit {self.proc.poll()}); "
                                     f"last lines {self.seen[-3:]}:\n{log}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line


def spawn_client(tmp: Path, key: int, genesis_file: Path, model_dir: Path, boot: str, servers: int, tokens: int,
                 *extra: str) -> tuple[subprocess.Popen, Lines]:
    """``tests/inference/client_proc.py`` with dev key ``key`` (data dir ``tmp/c<key>``; its log
    ``tmp/c<key>.log``), stdin and stdout piped; ``extra``: its prompt and stop arguments."""
    log = tmp / f"c{key}.log"
    err = open(log, "wb")  # noqa: SIM115 - the child's stderr log, open for its life
    proc = subprocess.Popen([sys.executable, "-m", "tests.inference.client_proc", "--data-dir", str(tmp / f"c{key}"),
                             "--genesis", str(genesis_file), "--model-dir", str(model_dir), "--key", str(key),
                             "--bootstrap", boot, "--servers", str(servers), "--tokens", str(tokens), *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                            cwd=ROOT)
    return proc, Lines(proc, log)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 just now (for a node whose address its peers need before it is up)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def validator_addr(port: int) -> str:
    """The multiaddr of dev key 0 listening on 127.0.0.1 ``port`` (``node start --port``)."""
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer(0)}"


def api_call(tmp: Path, key: int, method: str, path: str, **kw) -> dict:
    """``method path`` on the ``spawn``-ed node of dev key ``key`` with its own API token (read from its data dir;
    the node signs with its own key); the JSON reply. Fails with the node's answer on an HTTP error."""
    import httpx

    d = tmp / f"p{key}"
    info = json.loads((d / "node.json").read_text())
    token = (d / "api_token").read_text().strip()
    r = httpx.request(method, info["api"] + path, timeout=120.0, headers={"Authorization": f"Bearer {token}"}, **kw)
    assert r.status_code < 400, f"{method} {path} on node {key}: {r.status_code} {r.text[:500]}"
    return r.json()


def genesis_supply(genesis_file: Path) -> int:
    """Balances + bonds of the genesis file, base units (every ledger state of the chain must sum to this)."""
    g = load_genesis(genesis_file)
    return sum(balance + bond for _, balance, bond in g.balances)
