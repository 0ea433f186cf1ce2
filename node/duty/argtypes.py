"""argparse types shared by ``node``'s commands and the capabilities' ``node start`` flags (each raises
:class:`argparse.ArgumentTypeError` with the reason, which argparse prints as ``node: error: ...``)."""

from __future__ import annotations

import argparse
import math

from multiaddr import Multiaddr

from ..encoding import parse_amount
from ..p2p.addrs import AddrError, parse_addr


def int_at_least(text: str, low: int) -> int:
    """An integer >= ``low`` from ``text``."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < low:
        raise argparse.ArgumentTypeError(f"{n} is not >= {low}")
    return n


def positive(text: str) -> int:
    """An integer >= 1."""
    return int_at_least(text, 1)


def count(text: str) -> int:
    """An integer >= 0."""
    return int_at_least(text, 0)


def credits(text: str) -> int:
    """A decimal credit amount (0 allowed) in base units (:func:`node.encoding.parse_amount`)."""
    try:
        return parse_amount(text, allow_zero=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


__all__ = ["count", "credits", "int_at_least", "positive"]


def port(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (0: any free port)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a port (0..65535; 0 picks a free one)")
    return n


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0 (e.g. ``5`` or ``0.5``)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds > 0")
    return x


def bootstrap_addr(text: str) -> str:
    """argparse type: a multiaddr that names its peer, e.g. ``/ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...``."""
    try:
        ma = Multiaddr(text)
        ma.value_for_protocol("p2p")
    except Exception:  # noqa: BLE001 - multiaddr's parser raises many unrelated types
        raise argparse.ArgumentTypeError(f"{text!r} is not a multiaddr with a peer ID, e.g. "
                                         "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...") from None
    return text


def listen_addr(text: str) -> str:
    """argparse type: a TCP multiaddr to bind, e.g. ``/ip4/0.0.0.0/tcp/4001``."""
    try:
        return parse_addr(text, for_listen=True)
    except AddrError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def announce_addr(text: str) -> str:
    """argparse type: a dialable multiaddr, e.g. ``/ip4/203.0.113.7/tcp/4001`` or ``/dns4/host/tcp/4001``."""
    try:
        return parse_addr(text, for_listen=False)
    except AddrError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def gib(text: str) -> int:
    """``--max-memory``: GiB (a positive decimal) -> bytes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GiB as a number, e.g. 2.5; got {text!r}") from None
    if not 0 < value < 1 << 20:
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB, got {text!r}")
    return int(value * (1 << 30))


def span(text: str) -> tuple[int, int] | tuple[str, int | None] | str:
    """``--span``: ``START:END`` (blocks [START, END)), ``all``, ``auto`` or ``auto:N`` (N blocks, chosen)."""
    if text == "all":
        return "all"
    if text == "auto" or text.startswith("auto:"):
        try:
            n = int(text[5:]) if text != "auto" else None
        except ValueError:
            raise argparse.ArgumentTypeError("span auto:N needs a whole number of blocks N") from None
        if n is not None and n < 1:
            raise argparse.ArgumentTypeError("span auto:N needs N >= 1")
        return "auto", n
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError("span is START:END (blocks [START, END)), 'all', 'auto' or 'auto:N'") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError("need 0 <= START < END")
    return a, b
