"""Shunning a source that keeps connecting after it is refused: its SYNs dropped in the kernel for a while
(issue 23, check 3; the filter is :mod:`node.p2p.synfilter`, the refusals :mod:`node.p2p.admission`).

A refusal in the accept loop is cheap but not free; an attacker that reconnects as fast as it is reset (~1,600
times/s from one process) makes the node pay it over and over. :class:`ShunList` counts the refusals charged to one
IP address or one subnet (only the per-address and per-subnet reasons: a node-wide limit is nobody's fault) in
one-second windows. A key refused :attr:`ShunPolicy.after` times within one window is *shunned* for
:attr:`ShunPolicy.seconds`: the listening sockets drop its SYNs. Honest peers reconnect a few times a minute and
are never refused that often: their token bucket (10/s, burst 32) refuses a 64th connection in one second only
to a peer that tried more than 64 times.

Nothing outlives its cause (the project's rule for anything a peer caused): a shun ends by itself after
``seconds`` whatever the source does (while it is shunned the node cannot see whether it still churns; if it
does, it is refused ``after`` times and shunned again within a second), the table holds at most
:attr:`ShunPolicy.max_entries` shuns and :attr:`ShunPolicy.max_tracked` counters, and an address the node
reserves (validators, bootstrap peers, peers that did useful work) is never shunned, nor is a subnet holding one:
reserving an address lifts a shun that covers it.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .synfilter import MAX_PREFIXES, Prefix


@dataclass(frozen=True)
class ShunPolicy:
    """When a refused source is shunned (counts; seconds).

    Raises:
        ValueError: ``after`` below 0 (0 turns shunning off), ``seconds`` not positive, a bound below 1 or
            ``max_entries`` over :data:`node.p2p.synfilter.MAX_PREFIXES`.
    """

    after: int = 64  # refusals of one IP (or one subnet) within one second that shun it; 0: never shun
    seconds: float = 5.0  # how long a shun lasts
    max_entries: int = 128  # shuns at once (prefixes in the kernel filter); beyond, sources are refused as before
    max_tracked: int = 4096  # refusal counters kept (LRU beyond)

    def __post_init__(self) -> None:
        if self.after < 0 or self.seconds <= 0 or self.max_tracked < 1:
            raise ValueError("shun policy: after >= 0, seconds > 0, max_tracked >= 1")
        if not 1 <= self.max_entries <= MAX_PREFIXES:
            raise ValueError(f"shun policy: max_entries must be within 1..{MAX_PREFIXES}")


def prefix_of(key: str) -> Prefix:
    """The network of an admission key: an address (``"10.0.0.7"`` → ``10.0.0.7/32``) or a subnet
    (``"10.0.0.0/24"``).

    Raises:
        ValueError: not an address or a network.
    """
    return ipaddress.ip_network(key, strict=False)


class ShunList:
    """Refusal counters and the shuns they trigger (pure apart from the clock; see the module doc).

    Args:
        policy: :class:`ShunPolicy`.
        clock: monotonic seconds.
        reserved: whether an address (normalised) is reserved now; such an address, and a subnet that holds one
            among ``reserved_ips()``, are never shunned.
        reserved_ips: the addresses reserved now (bounded by the admission's table).

    Attributes:
        version: bumped whenever the set of shunned prefixes changes (the listeners re-attach their filter).
        shuns: shuns made since start (a counter for ``/v1/status``).
    """

    def __init__(self, policy: ShunPolicy | None = None, clock: Callable[[], float] | None = None,
                 reserved: Callable[[str], bool] = lambda ip: False,
                 reserved_ips: Callable[[], Iterable[str]] = tuple):
        self.policy = policy or ShunPolicy()
        self.clock = clock or (lambda: 0.0)
        self.reserved, self.reserved_ips = reserved, reserved_ips
        self._counts: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (window second, refusals)
        self._shunned: dict[str, tuple[float, Prefix]] = {}  # shunned key -> (monotonic end, its network)
        self.version = 0
        self.shuns = 0

    def refused(self, key: str, subnet: bool) -> bool:
        """Count one refusal charged to ``key`` (a normalised address, or a subnet when ``subnet``); True when it
        made ``key`` shunned now."""
        p = self.policy
        if p.after == 0 or key in self._shunned:
            return False
        second = int(self.clock())
        window, n = self._counts.pop(key, (second, 0))
        n = n + 1 if window == second else 1
        self._counts[key] = (second, n)
        while len(self._counts) > p.max_tracked:
            self._counts.popitem(last=False)
        if n < p.after or len(self._shunned) >= p.max_entries:
            return False
        if self._protected(key, subnet):
            self._counts[key] = (second, 0)  # looked up again only after another `after` refusals
            return False
        try:
            self._shunned[key] = (self.clock() + p.seconds, prefix_of(key))
        except ValueError:
            return False
        del self._counts[key]
        self.version += 1
        self.shuns += 1
        return True

    def _protected(self, key: str, subnet: bool) -> bool:
        if not subnet:
            return self.reserved(key)
        net = prefix_of(key)
        for ip in self.reserved_ips():
            try:
                if ipaddress.ip_address(ip) in net and self.reserved(ip):
                    return True
            except ValueError:
                continue
        return False

    def lift_covering(self, ip: str) -> None:
        """End every shun whose prefix holds ``ip`` (called when the node reserves ``ip``)."""
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return
        gone = [k for k, (_end, net) in self._shunned.items() if addr.version == net.version and addr in net]
        for k in gone:
            self._drop(k)

    def _drop(self, key: str) -> None:
        del self._shunned[key]
        self.version += 1

    def expire(self) -> float | None:
        """End the shuns that are due; the seconds until the next one ends (None: no shun left)."""
        now = self.clock()
        for k in [k for k, (end, _net) in self._shunned.items() if end <= now]:
            self._drop(k)
        return min(end for end, _net in self._shunned.values()) - now if self._shunned else None

    def prefixes(self) -> list[Prefix]:
        """The shunned prefixes now (what the kernel filter drops)."""
        return [net for _end, net in self._shunned.values()]

    def __len__(self) -> int:
        return len(self._shunned)
