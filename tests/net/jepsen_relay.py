"""Delaying TCP relays for the Jepsen-style test's slow validator (test infra only; the kernel has no netem).

    python tests/net/jepsen_relay.py DELAY_S LISTEN_IP:PORT=TARGET_IP:PORT[@SOURCE_IP] ...

Each argument after the delay is one relay: it listens on ``LISTEN_IP:PORT`` and forwards every connection to
``TARGET_IP:PORT`` (from ``SOURCE_IP`` when given), each direction delayed by ``DELAY_S`` seconds; chunks keep
their order (as ``bench/inference.py --wan``'s relay). Prints ``ready`` once every relay listens; runs until
killed.
"""

from __future__ import annotations

import contextlib
import math
import sys

import trio


async def pump(src, dst, delay: float) -> None:
    send, recv = trio.open_memory_channel(math.inf)

    async def reader() -> None:
        async with send:
            try:
                async for chunk in src:
                    send.send_nowait((trio.current_time() + delay, chunk))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def writer() -> None:
        async for due, chunk in recv:
            await trio.sleep_until(due)
            try:
                await dst.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, AttributeError):
            await dst.send_eof()

    async with trio.open_nursery() as n:
        n.start_soon(reader)
        n.start_soon(writer)


async def relay(listen: tuple[str, int], target: tuple[str, int], source: str | None, delay: float,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    async def handle(client) -> None:
        try:
            with trio.fail_after(10):
                server = await trio.open_tcp_stream(*target, local_address=source)
        except (OSError, trio.TooSlowError):
            await client.aclose()
            return
        async with client, server:
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(pump, client, server, delay)
                    n.start_soon(pump, server, client, delay)
            except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # one connection ended badly: the relay goes on

    listeners = await trio.open_tcp_listeners(listen[1], host=listen[0])
    task_status.started()
    await trio.serve_listeners(handle, listeners)


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


async def main(delay: float, specs: list[str]) -> None:
    async with trio.open_nursery() as n:
        for spec in specs:
            listen, rest = spec.split("=", 1)
            target, _, source = rest.partition("@")
            await n.start(relay, _addr(listen), _addr(target), source or None, delay)
        print("ready", flush=True)


if __name__ == "__main__":
    trio.run(main, float(sys.argv[1]), sys.argv[2:])
