"""Outbound TCP from a chosen loopback source address, per trio task (test infra).

py-libp2p dials with ``trio.open_tcp_stream(host, port)`` and no source address, so every in-process host reaches
``127.0.0.1`` from ``127.0.0.1``. Any ``127.x.y.z`` is a loopback address on Linux: a dial whose socket is bound
to ``127.0.1.5`` looks to the node like a peer on another machine, in another /24. :func:`source` sets the source
for the current task and the tasks it starts (a context variable), so one test process can hold an attacker at
``127.0.0.2`` and an honest peer at ``127.0.1.5`` side by side.

    install()
    with source("127.0.0.2"):
        await host.connect(addrs)   # the node sees 127.0.0.2
"""

from __future__ import annotations

import contextvars
import ipaddress
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio

_SOURCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("tally_test_source", default=None)
_ORIGINAL = trio.open_tcp_stream


async def _open_tcp_stream(host, port, *, local_address=None, **kw):
    return await _ORIGINAL(host, port, local_address=local_address or _SOURCE.get(), **kw)


def install() -> None:
    """Route ``trio.open_tcp_stream`` through the per-task source (idempotent; no effect outside :func:`source`)."""
    trio.open_tcp_stream = _open_tcp_stream


@contextmanager
def source(ip: str) -> Iterator[None]:
    """Dials started in this block (and in tasks started from it) leave from ``ip``, a loopback IPv4 address.

    Raises:
        ValueError: ``ip`` is not an IPv4 loopback address.
    """
    if not ipaddress.IPv4Address(ip).is_loopback:
        raise ValueError(f"{ip} is not a loopback address")
    install()
    token = _SOURCE.set(ip)
    try:
        yield
    finally:
        _SOURCE.reset(token)


def idle_sockets(ip: str, target: tuple[str, int], n: int) -> list[socket.socket]:
    """``n`` raw TCP connections from ``ip`` to ``target`` that never send a byte (blocking connects; the
    kernel completes them from the listen backlog even when the node does not accept at once)."""
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((ip, 0))
        s.settimeout(5.0)
        try:
            s.connect(target)
        except OSError:
            s.close()
            continue
        out.append(s)
    return out


def flood(ips: list[str], target: tuple[str, int], seconds: float, hold: int) -> int:
    """Keep opening idle TCP connections to ``target`` for ``seconds``, round-robin over ``ips`` (each socket bound
    to one), holding at most ``hold`` at once (the oldest closed first); every one is closed at the end. Blocking:
    run it in a thread. Returns how many connections were opened."""
    held: list[socket.socket] = []
    opened, i = 0, 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((ips[i % len(ips)], 0))
            s.settimeout(1.0)
            i += 1
            try:
                s.connect(target)
            except OSError:
                s.close()
                continue
            opened += 1
            held.append(s)
            if len(held) > hold:
                held.pop(0).close()
    finally:
        for s in held:
            s.close()
    return opened


if __name__ == "__main__":  # python -m tests.net.srcbind FIRST_IP LAST_IP HOST PORT SECONDS HOLD
    import sys

    first, last, host, port, secs, hold = sys.argv[1:7]
    lo, hi = int(ipaddress.IPv4Address(first)), int(ipaddress.IPv4Address(last))
    pool = [str(ipaddress.IPv4Address(x)) for x in range(lo, hi + 1)]
    print(flood(pool, (host, int(port)), float(secs), int(hold)), flush=True)
