"""Make every outbound TCP connection of this process leave from one loopback source address.

py-libp2p dials with ``trio.open_tcp_stream(host, port)`` and no source address, so every process on this
machine reaches ``127.0.0.1`` from ``127.0.0.1``. Any ``127.x.y.z`` is a loopback address on Linux: binding the
source to ``127.0.1.2`` (or ``127.0.0.7``) makes a process look to the node like a peer on another machine, in
another /24 (or the same one), which is what the pre-handshake limits key on.
"""

from __future__ import annotations

import functools
import ipaddress

import trio

_ORIGINAL = trio.open_tcp_stream


def bind_source(ip: str) -> None:
    """From now on, ``trio.open_tcp_stream`` in this process binds its socket to ``ip`` (a loopback IPv4
    address, any port) unless the caller names a ``local_address``.

    Raises:
        ValueError: ``ip`` is not an IPv4 loopback address.
    """
    if not ipaddress.IPv4Address(ip).is_loopback:
        raise ValueError(f"{ip} is not a loopback address")

    @functools.wraps(_ORIGINAL)
    async def open_tcp_stream(host, port, *, local_address=None, **kw):
        return await _ORIGINAL(host, port, local_address=local_address or ip, **kw)

    trio.open_tcp_stream = open_tcp_stream
