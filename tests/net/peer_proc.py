"""A real Tally libp2p host (:class:`node.p2p.host.P2PHost`) in its own process, driven over stdin/stdout.

Child (run it inside a namespace with :meth:`tests.net.netns.Netns.popen`)::

    python tests/net/peer_proc.py --listen-host 10.247.0.2 [--port 0] [--seed 1]

prints one JSON line ``{"peer": "12D3KooW...", "addr": "/ip4/10.247.0.2/tcp/PORT/p2p/12D3KooW..."}`` once
listening, serves :data:`ECHO` (reply: ``{"echo": <request>, "from": <peer id>, "remote": [ip, port]}``, the
address the connection came from as this host sees it), and reads JSON commands from stdin, one per line, each
answered with one JSON line:

    {"op": "request", "addr": MULTIADDR, "msg": {...}, "timeout": 5}  -> {"ok": true, "reply": {...}}
                                                                         or {"ok": false, "error": "Type: ..."}
    {"op": "peers"}                                                   -> {"ok": true, "peers": [peer ids]}

``request`` dials the address if not connected (``P2PHost.remember`` + ``request``), so a failed dial or a
stalled link shows as ``ok: false``. EOF on stdin stops the process.

Parent side: :class:`PeerProc` starts one and wraps the protocol, every wait bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import multiaddr
import trio
from libp2p.peer.peerinfo import info_from_p2p_addr

from node.identity import Identity, dev_seed
from node.p2p.framing import read_msg, write_msg
from node.p2p.host import P2PHost

ROOT = Path(__file__).resolve().parents[2]
ECHO = "/tally/test/echo/1.0.0"
CHAIN = "tally-netns-test"


# ------------------------------------------------------------------ parent side

class PeerProc:
    """A :mod:`peer_proc` child in ``host``'s namespace (started by ``net.popen``, so ``net.close()`` stops it).

    Args:
        net: the :class:`tests.net.netns.Netns`.
        host: the :class:`tests.net.netns.Host` to run in; the child listens on ``host.ip``.
        seed: identity seed (``node.identity.dev_seed``); peers of one run need distinct seeds.
        start_timeout: seconds to wait for the child's address line.

    Attributes:
        peer: its peer ID. addr: its listen multiaddr (``/ip4/<host.ip>/tcp/<port>/p2p/<peer>``).

    Raises:
        RuntimeError: the child exited or printed nothing within ``start_timeout`` (its stderr in the message).
    """

    def __init__(self, net, host, seed: int, start_timeout: float = 30.0):
        self.host = host
        self.proc = net.popen(host, [sys.executable, str(Path(__file__).resolve()), "--listen-host", host.ip,
                                     "--seed", str(seed)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              bufsize=1, cwd=str(ROOT))
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()
        info = self._read(start_timeout)
        self.peer, self.addr = info["peer"], info["addr"]

    def _pump(self, f, q) -> None:
        for line in f:
            q.put(line)
        q.put(None)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._err.append(line)
            del self._err[:-40]

    def stderr_tail(self) -> str:
        """The child's last 40 stderr lines."""
        return "".join(self._err)

    def _read(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"peer in {self.host.ns}: no answer within {timeout} s\n{self.stderr_tail()}") from None
        if line is None:
            self.proc.wait(5)
            raise RuntimeError(f"peer in {self.host.ns} exited ({self.proc.returncode})\n{self.stderr_tail()}")
        return json.loads(line)

    def command(self, cmd: dict, timeout: float) -> dict:
        """Send one command, return its JSON answer (waits at most ``timeout`` seconds).

        Raises:
            RuntimeError: no answer in time, or the child died.
        """
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def request(self, addr: str, msg: dict | None = None, timeout: float = 5.0) -> dict:
        """Ask the child to send an :data:`ECHO` request to ``addr``; returns ``{"ok": True, "reply": ...}`` or
        ``{"ok": False, "error": ...}`` (a failure is an answer, not an exception). Bounded by ``timeout`` + 5 s."""
        return self.command({"op": "request", "addr": addr, "msg": msg or {}, "timeout": timeout}, timeout + 5.0)

    def stop(self, timeout: float = 5.0) -> int | None:
        """Close stdin (the child stops) and wait; kill it after ``timeout`` s. Returns its exit code."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


# ------------------------------------------------------------------ child side

async def _child(args) -> None:
    host = P2PHost(Identity.from_seed(dev_seed(args.seed)), args.port, CHAIN, listen_host=args.listen_host)

    async def echo_stream(stream, remote: str) -> None:  # like set_request_handler, plus the remote address
        msg = await read_msg(stream, 10.0)
        addr = stream.get_remote_address()
        await write_msg(stream, {"status": "ok", "echo": msg, "from": remote,
                                 "remote": list(addr) if addr else None}, timeout=10.0)

    host.set_handler(ECHO, echo_stream)
    out = sys.stdout

    def say(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    async with host.running():
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
                if not line.strip():
                    continue
                cmd = json.loads(line)
                if cmd.get("op") == "peers":
                    say({"ok": True, "peers": host.connected_peers()})
                elif cmd.get("op") == "request":
                    try:
                        pid = info_from_p2p_addr(multiaddr.Multiaddr(cmd["addr"])).peer_id.to_base58()
                        host.remember([cmd["addr"]])
                        reply = await host.request(pid, ECHO, cmd.get("msg", {}), timeout=float(cmd["timeout"]))
                        say({"ok": True, "reply": reply})
                    except Exception as e:  # noqa: BLE001 - any failure is reported to the test as an error line
                        say({"ok": False, "error": f"{type(e).__name__}: {e}"})
                else:
                    say({"ok": False, "error": f"unknown op {cmd.get('op')!r}"})


def main() -> None:
    p = argparse.ArgumentParser(description="A P2PHost driven over stdin/stdout (tests/net).")
    p.add_argument("--listen-host", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    trio.run(_child, args)


if __name__ == "__main__":
    main()
