"""Per-peer misbehaviour scores (pure; the clock is passed in).

Every offence — a malformed frame, undecodable msgpack, a tensor whose shape does not match its bytes, a bad
countersignature — lowers the offending peer's score by a weight. Scores recover linearly towards 0 at
``recovery_per_s`` points per second, so an honest peer's rare glitch is forgotten. A peer whose score falls to
``disconnect_at`` or below is to be disconnected and its streams refused for ``ban_s`` seconds; after the ban
it starts again from 0.

The host (:mod:`node.p2p.host`) applies this: it answers the offending stream with an error frame, calls
:meth:`PeerScores.penalize`, and disconnects when told to.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# offence weights (points)
MALFORMED_FRAME = 5.0  # framing broken, msgpack undecodable, not a map
BAD_REQUEST = 2.0  # well-formed but invalid: unknown message, bad tensor, wrong span...
BAD_SIGNATURE = 10.0  # a countersignature that does not verify


@dataclass
class _Entry:
    score: float = 0.0
    at: float = 0.0
    banned_until: float = 0.0
    offences: int = 0


class PeerScores:
    """Scores of remote peers, keyed by peer ID string.

    Args:
        clock: seconds, monotonic (default ``time.monotonic``).
        disconnect_at: a score at or below this (negative) disconnects the peer.
        recovery_per_s: points regained per second, towards 0.
        ban_s: seconds a disconnected peer's streams are refused (0: disconnect only).
        max_peers: entries kept; the least recently penalised are forgotten first (bounded memory).

    Raises:
        ValueError: ``disconnect_at >= 0``, negative ``recovery_per_s`` or ``ban_s``, ``max_peers < 1``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, disconnect_at: float = -20.0,
                 recovery_per_s: float = 0.5, ban_s: float = 60.0, max_peers: int = 4096):
        if disconnect_at >= 0 or recovery_per_s < 0 or ban_s < 0 or max_peers < 1:
            raise ValueError("need disconnect_at < 0, recovery_per_s >= 0, ban_s >= 0, max_peers >= 1")
        self.clock, self.disconnect_at, self.recovery, self.ban_s = clock, disconnect_at, recovery_per_s, ban_s
        self.max_peers = max_peers
        self._peers: dict[str, _Entry] = {}
        self.disconnects = 0

    def _decayed(self, e: _Entry, now: float) -> float:
        return min(0.0, e.score + self.recovery * max(0.0, now - e.at))

    def score(self, peer: str) -> float:
        """Current score of ``peer`` (0 for a peer never penalised, negative otherwise)."""
        e = self._peers.get(peer)
        return 0.0 if e is None else self._decayed(e, self.clock())

    def offences(self, peer: str) -> int:
        """Offences recorded for ``peer`` since it was last forgotten."""
        e = self._peers.get(peer)
        return 0 if e is None else e.offences

    def banned(self, peer: str) -> bool:
        """Whether ``peer``'s streams are to be refused now."""
        e = self._peers.get(peer)
        return e is not None and self.clock() < e.banned_until

    def penalize(self, peer: str, weight: float, ban_s: float | None = None) -> bool:
        """Lower ``peer``'s score by ``weight`` (> 0) points.

        Args:
            ban_s: seconds of ban when this crosses ``disconnect_at`` (default: the constructor's ``ban_s``).

        Returns:
            True when the peer has just crossed ``disconnect_at``: the caller disconnects it. Its score then
            restarts at 0 and it is banned for ``ban_s`` seconds.
        """
        now = self.clock()
        e = self._peers.pop(peer, None) or _Entry(at=now)
        e.score, e.at = self._decayed(e, now) - max(0.0, weight), now
        e.offences += 1
        self._peers[peer] = e  # most recently penalised last
        while len(self._peers) > self.max_peers:
            self._peers.pop(next(iter(self._peers)))
        if e.score <= self.disconnect_at:
            e.score, e.banned_until = 0.0, now + (self.ban_s if ban_s is None else max(0.0, ban_s))
            self.disconnects += 1
            return True
        return False
