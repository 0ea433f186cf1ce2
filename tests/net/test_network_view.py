"""Issue 25's network view on a real in-process swarm (127.0.0.1, tiny model): ``/v1/status``'s ``network.peers``,
the explorer's ``/peers`` page, ``node peers`` and ``node status`` list every connected peer with its path, address
and measured round trip, and the round trips reach the route planner's table."""

from __future__ import annotations

import subprocess
import sys

import httpx
import trio

from node.compute.model import make_tiny
from node.peers_cli import format_peers, format_status
from tests.e2e.swarm import swarm

from .tally import ROOT

SPANS = [(0, 3), (3, 6)]


def _cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_status_page_and_cli_show_each_peer_with_path_address_and_round_trip(tmp_path):
    model = make_tiny(tmp_path / "models", seed=0)
    out: dict = {}

    async def main() -> None:
        async with swarm(tmp_path, model, SPANS) as nodes:
            client, servers = nodes[0], [n.ident.peer_id for n in nodes[1:]]
            with trio.fail_after(60):  # the first ping round runs PING_PERIOD (10 s) after start
                while True:
                    rows = {r["peer"]: r for r in client.net.peers()}
                    if all(p in rows and rows[p]["rtt_ms"] is not None for p in servers):
                        break
                    await trio.sleep(0.5)
            out["rows"], out["servers"] = rows, servers
            out["routed_rtt"] = {p: client.swarm.rtt.get(p) for p in servers}

            def http() -> None:
                out["status"] = httpx.get(f"{client.api_url}/v1/status", timeout=30).json()
                out["page"] = httpx.get(f"{client.api_url}/peers", headers={"Accept": "text/html"}, timeout=30).text
                out["peers_cli"] = _cli("peers", "--data-dir", str(client.cfg.data_dir))
                out["status_cli"] = _cli("status", "--data-dir", str(client.cfg.data_dir))

            await trio.to_thread.run_sync(http)

    trio.run(main)
    rows, servers = out["rows"], out["servers"]
    for p in servers:
        assert rows[p]["path"] == "direct" and rows[p]["relay"] is None, rows[p]
        assert rows[p]["addr"].startswith("/ip4/127.0.0.1/tcp/"), rows[p]
        assert 0 <= rows[p]["rtt_ms"] < 5000 and rows[p]["conns"] >= 1, rows[p]
        assert out["routed_rtt"][p] is not None  # the planner's round-trip table heard the pings
    api_rows = {r["peer"]: r for r in out["status"]["network"]["peers"]}
    assert set(servers) <= set(api_rows) and all(api_rows[p]["path"] == "direct" for p in servers)
    for p in servers:
        assert p[:20] in out["page"]
        line = next(ln for ln in out["peers_cli"].splitlines() if ln.startswith(p))
        assert " direct " in line and "/ip4/127.0.0.1/tcp/" in line and " ms" in line, line
    assert out["status_cli"].startswith(f"peer id       {out['status']['peer_id']}")
    assert "direct, 0 relayed" in out["status_cli"]
    assert "<td>direct</td>" in out["page"]


def test_the_text_forms_name_the_relay_of_a_relayed_peer():
    net = {"reachability": "private", "relay_reservation": "R", "peers": [
        {"peer": "P1", "path": "direct", "addr": "/ip4/203.0.113.7/tcp/4001", "relay": None, "rtt_ms": 3.14,
         "conns": 1},
        {"peer": "P2", "path": "relayed", "addr": "/p2p/R/p2p-circuit/p2p/P2", "relay": "R", "rtt_ms": None,
         "conns": 1}]}
    lines = format_peers(net).splitlines()
    assert lines[0].split() == ["P1", "direct", "/ip4/203.0.113.7/tcp/4001", "rtt", "3.1", "ms"]
    assert lines[1].split() == ["P2", "relayed", "/p2p/R/p2p-circuit/p2p/P2", "rtt", "-", "via", "R"]
    text = format_status({"peer_id": "ME", "chain_id": "c", "height": 3, "addrs": ["/a"], "network": net})
    assert "reachability  private" in text and "reserved on R" in text and "2 connected: 1 direct, 1 relayed" in text
    assert format_peers({"peers": []}) == "no connected peers"
