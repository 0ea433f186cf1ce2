"""A Tally host with node.net.relay's roles (circuit relay v2, DCUtR) in its own process, driven over stdin/stdout.

Child (run it inside a namespace with :meth:`tests.net.netns.Netns.popen`)::

    python tests/net/relay_proc.py --listen-host 10.247.0.2 --seed 1 [--hop] [--dcutr]

prints ``{"peer": ..., "addr": "/ip4/<ip>/tcp/<port>/p2p/<peer>"}`` once listening, serves an echo protocol
(reply ``{"echo": msg, "from": peer, "remote": [ip, port] or null}``, the stream's remote address as this host
sees it), and answers one JSON line per command line:

    {"op": "connect", "addr": A}          connect directly and wait until identify lists the HOP protocol when
                                          the peer is a relay -> {"ok": bool, "relays": [peer ids]}
    {"op": "reserve"}                     Relay.reserve() -> {"ok": bool, "relay": id, "circuit": [addrs]}
    {"op": "dial", "addr": CIRCUIT}       Relay.dial(); the connections to the target right after it returns
                                          -> {"ok": bool, "conns": [...]}
    {"op": "conns", "peer": P}            -> {"ok": true, "conns": [{"addrs": [...], "remote": [ip, port]}]}
    {"op": "request", "peer": P, "msg": {...}, "timeout": T}  -> {"ok": true, "reply": {...}} or an error

EOF on stdin stops it. Parent side: :class:`RelayProc` (the bounded waits of :class:`tests.net.peer_proc.PeerProc`).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import trio
from libp2p.peer.id import ID

from node.identity import Identity, dev_seed
from node.net.relay import Relay
from node.p2p.framing import read_msg, write_msg
from node.p2p.host import P2PHost

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.net.peer_proc import CHAIN, ROOT, PeerProc

ECHO = "/tally/test/echo/1.0.0"


class RelayProc(PeerProc):
    """A :mod:`relay_proc` child in ``host``'s namespace (``net.close()`` stops it).

    Args:
        net: the :class:`tests.net.netns.Netns`. host: the :class:`tests.net.netns.Host` to run in.
        seed: identity seed. hop: relay for others. dcutr: run hole punching.
        start_timeout: seconds to wait for the child's address line.

    Raises:
        RuntimeError: the child exited or printed nothing within ``start_timeout``.
    """

    def __init__(self, net, host, seed: int, hop: bool = False, dcutr: bool = False,
                 start_timeout: float = 30.0):
        self.host = host
        argv = [sys.executable, str(Path(__file__).resolve()), "--listen-host", host.ip, "--seed", str(seed)]
        argv += ["--hop"] if hop else []
        argv += ["--dcutr"] if dcutr else []
        self.proc = net.popen(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, bufsize=1, cwd=str(ROOT))
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()
        info = self._read(start_timeout)
        self.peer, self.addr = info["peer"], info["addr"]


def _conns(host: P2PHost, peer: str) -> list[dict]:
    out = []
    for c in host.libp2p.get_network().get_connections(ID.from_base58(peer)):
        try:
            addrs = [str(a) for a in c.get_transport_addresses()]
        except Exception as e:  # noqa: BLE001 - diagnostics only: any failure is shown
            addrs = [f"? {type(e).__name__}"]
        try:
            remote = c.muxed_conn.get_remote_address()
        except Exception:  # noqa: BLE001 - diagnostics only: no address
            remote = None
        out.append({"addrs": addrs, "remote": list(remote) if remote else None})
    return out


async def _command(host: P2PHost, relay: Relay, cmd: dict) -> dict:
    op = cmd.get("op")
    if op == "connect":
        n = await host.connect([cmd["addr"]], timeout=10.0)
        peer = cmd["addr"].rsplit("/p2p/", 1)[1]
        with trio.move_on_after(10):  # identify: a relay's HOP protocol shows in the peerstore
            while cmd.get("relay") and peer not in relay.relays():
                await trio.sleep(0.05)
        return {"ok": n > 0, "relays": relay.relays()}
    if op == "reserve":
        got = await relay.reserve()
        return {"ok": got is not None, "relay": got, "circuit": relay.circuit_addrs}
    if op == "dial":
        ok = await relay.dial(cmd["addr"])
        return {"ok": ok, "conns": _conns(host, cmd["addr"].rsplit("/p2p/", 1)[1])}  # no await in between
    if op == "conns":
        return {"ok": True, "conns": _conns(host, cmd["peer"])}
    if op == "request":
        reply = await host.request(cmd["peer"], ECHO, cmd.get("msg", {}), timeout=float(cmd["timeout"]))
        return {"ok": True, "reply": reply}
    return {"ok": False, "error": f"unknown op {op!r}"}


async def _child(args) -> None:
    host = P2PHost(Identity.from_seed(dev_seed(args.seed)), 0, CHAIN, listen_host=args.listen_host)

    async def echo_stream(stream, remote: str) -> None:
        msg = await read_msg(stream, 10.0)
        addr = stream.get_remote_address()
        await write_msg(stream, {"status": "ok", "echo": msg, "from": remote,
                                 "remote": list(addr) if addr else None}, timeout=10.0)

    host.set_handler(ECHO, echo_stream)

    def say(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    async with host.running():
        relay = Relay(host.libp2p, hop=args.hop, dcutr=args.dcutr)
        await host.start_service(relay.run)
        say({"peer": host.peer_id, "addr": host.addrs[0]})
        stdin = trio.lowlevel.FdStream(os.dup(0))
        buf = b""
        while True:
            chunk = await stdin.receive_some(65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    try:
                        with trio.fail_after(30):
                            say(await _command(host, relay, json.loads(line)))
                    except Exception as e:  # noqa: BLE001 - any failure is reported to the test as an error line
                        say({"ok": False, "error": f"{type(e).__name__}: {e}"})


def main() -> None:
    p = argparse.ArgumentParser(description="A P2PHost with node.net.relay's roles, driven over stdin/stdout.")
    p.add_argument("--listen-host", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hop", action="store_true", help="relay for others")
    p.add_argument("--dcutr", action="store_true", help="run DCUtR (hole punching)")
    args = p.parse_args()
    trio.run(_child, args)


if __name__ == "__main__":
    main()
