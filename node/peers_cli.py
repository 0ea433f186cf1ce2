"""``node peers`` and ``node status``: the running node's network view on the command line (issue 25).

``node peers`` prints one line per connected peer, as ``ipfs swarm peers`` does, with how it is reached::

    12D3KooWAbc…  direct   /ip4/203.0.113.7/tcp/4001                      rtt 3.1 ms
    12D3KooWDef…  relayed  /p2p/12D3KooWRly…/p2p-circuit/p2p/12D3KooWDef…  rtt 41.0 ms  via 12D3KooWRly…

``node status`` prints the node's identity and reachability first (as ``ipfs id``), then the same peer lines. Both
read ``GET /v1/status`` of the node running in ``--data-dir`` (:class:`node.wallet.client.NodeApi`); ``--json``
prints the API's JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .wallet.client import NodeApi, WalletError


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_data_dir: Path) -> None:
    """Register ``node peers`` and ``node status`` on ``sub`` (argparse sub-parsers)."""
    for name, text in (("peers", "connected peers: direct or relayed (through whom), address, round trip"),
                       ("status", "this node's identity, reachability, relay, height and connected peers")):
        p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}, from the node running in "
                                                        "--data-dir (its API URL is read from node.json).")
        p.add_argument("--data-dir", type=Path, default=default_data_dir,
                       help="the node's data dir (default: %(default)s)")
        p.add_argument("--json", action="store_true", help="print the API's JSON instead of text")


def format_peers(network: dict[str, Any] | None) -> str:
    """The peer lines of a ``/v1/status`` ``network`` object (see the module doc); one line when none."""
    rows = (network or {}).get("peers") or []
    if not rows:
        return "no connected peers"
    width = max(len(r.get("addr") or "-") for r in rows)
    out = []
    for r in rows:
        rtt = "rtt -" if r.get("rtt_ms") is None else f"rtt {r['rtt_ms']:.1f} ms"
        via = f"  via {r['relay']}" if r.get("relay") else ""
        out.append(f"{r['peer']}  {r['path']:<7}  {(r.get('addr') or '-'):<{width}}  {rtt}{via}")
    return "\n".join(out)


def format_status(st: dict[str, Any]) -> str:
    """``node status``'s text for a ``/v1/status`` reply."""
    net = st.get("network") or {}
    lines = [f"peer id       {st['peer_id']}",
             f"chain         {st['chain_id']} at height {st['height']}",
             f"reachability  {net.get('reachability', 'unknown (no network service)')}"]
    if net.get("relay_reservation"):
        lines.append(f"relay         reserved on {net['relay_reservation']} (peers behind NATs reach us through it)")
    if net.get("relaying"):
        c = net.get("circuits") or {}
        lines.append(f"relaying      for others: {c.get('member', 0)} member and {c.get('open', 0)} other circuits")
    lines.append("announced     " + ("\n              ".join(st.get("addrs") or []) or "nothing"))
    rows = net.get("peers") or []
    direct = sum(1 for r in rows if r.get("path") == "direct")
    lines.append(f"peers         {len(rows)} connected: {direct} direct, {len(rows) - direct} relayed")
    return "\n".join(lines) + "\n\n" + format_peers(net)


def run(args: argparse.Namespace) -> int:
    """Run ``node peers`` or ``node status`` (``args.cmd``); an unreachable node exits 1 with one line on
    stderr."""
    try:
        api = NodeApi(args.data_dir)
        try:
            st = api.get("/v1/status")
        finally:
            api.close()
    except WalletError as e:
        print(f"node {args.cmd}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st if args.cmd == "status" else (st.get("network") or {}).get("peers", []), indent=2))
    else:
        print(format_status(st) if args.cmd == "status" else format_peers(st.get("network")))
    return 0
