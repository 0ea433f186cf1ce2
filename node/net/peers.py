"""The address book: which peers a node knows, how to reach them, and when to dial them again (pure).

Peers are learnt from bootstrap addresses (genesis file and ``--bootstrap``), from presence gossip, and from
peer exchange (``/tally/peers/1.0.0``, :mod:`node.net.service`). The book is saved to ``<data-dir>/peers.json``
so a restarted node rejoins without its bootstrap peers. A failed dial backs off exponentially
(1 s · 2^fails, capped at :data:`MAX_BACKOFF`, with ±20 % jitter derived from the peer ID so it is
deterministic for tests); bootstrap peers are never forgotten, others after :data:`FORGET_AFTER` seconds unseen.
Peers refused by the genesis handshake are never dialled again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_BACKOFF = 60.0  # seconds
FORGET_AFTER = 7 * 24 * 3600.0  # seconds unseen before a non-bootstrap peer is dropped
MAX_PEERS = 1024
MAX_ADDRS = 8


@dataclass
class PeerEntry:
    """One known peer. Times are wall-clock seconds (``time.time``), so they survive restarts."""

    addrs: list[str] = field(default_factory=list)  # without /p2p/<peer>
    bootstrap: bool = False
    last_seen: float = 0.0
    fails: int = 0
    next_try: float = 0.0
    refused: bool = False  # another genesis: never dial


def _jitter(peer: str) -> float:
    return 0.8 + 0.4 * (hashlib.sha256(peer.encode()).digest()[0] / 255)


class PeerBook:
    """Known peers and their dial schedule.

    Args:
        path: ``peers.json`` to load and save (None: memory only).
    """

    def __init__(self, path: Path | None = None):
        self.path = path
        self.peers: dict[str, PeerEntry] = {}
        if path is not None and path.exists():
            self._load()

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return  # a damaged book is only a cache: start empty, bootstrap again
        for pid, e in (doc.get("peers") or {}).items() if isinstance(doc, dict) else []:
            if isinstance(pid, str) and isinstance(e, dict) and isinstance(e.get("addrs"), list):
                self.peers[pid] = PeerEntry(addrs=[a for a in e["addrs"] if isinstance(a, str)][:MAX_ADDRS],
                                            bootstrap=bool(e.get("bootstrap")),
                                            last_seen=float(e.get("last_seen", 0.0)),
                                            refused=bool(e.get("refused")))

    def save(self) -> None:
        """Write the book atomically (temp file + rename). No-op without a path."""
        if self.path is None:
            return
        doc = {"peers": {p: {"addrs": e.addrs, "bootstrap": e.bootstrap, "last_seen": e.last_seen,
                             "refused": e.refused} for p, e in self.peers.items()}}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)

    def add(self, peer: str, addrs: list[str], now: float, bootstrap: bool = False) -> bool:
        """Learn (or refresh) ``peer`` at ``addrs`` (newest first, deduplicated). Returns True if it is new."""
        new = peer not in self.peers
        e = self._entry(peer)
        e.addrs = list(dict.fromkeys([*addrs, *e.addrs]))[:MAX_ADDRS]
        e.bootstrap = e.bootstrap or bootstrap
        e.last_seen = max(e.last_seen, now)
        return new

    def _evict(self, now: float, keep: str | None = None) -> None:
        victims = sorted((e.last_seen, p) for p, e in self.peers.items() if not e.bootstrap and p != keep)
        for _, p in victims[:len(self.peers) - MAX_PEERS]:
            del self.peers[p]

    def refuse(self, peer: str) -> None:
        """Never dial ``peer`` again (another chain or genesis), as long as the book remembers it (the book is
        bounded: :data:`MAX_PEERS`; a forgotten peer is refused again by its hello)."""
        self._entry(peer).refused = True

    def _entry(self, peer: str) -> PeerEntry:
        """``peer``'s entry, created if new; the least recently seen non-bootstrap entries are evicted beyond
        :data:`MAX_PEERS` (never the one returned)."""
        e = self.peers.get(peer)
        if e is None:
            e = self.peers[peer] = PeerEntry()
            if len(self.peers) > MAX_PEERS:
                self._evict(0.0, keep=peer)
        return e

    def connected(self, peer: str, now: float) -> None:
        """A connection to ``peer`` exists: reset its backoff."""
        e = self.peers.get(peer)
        if e is not None:
            e.fails, e.next_try, e.last_seen = 0, 0.0, now

    def failed(self, peer: str, now: float) -> float:
        """A dial to ``peer`` failed; returns the seconds until the next try."""
        e = self._entry(peer)
        e.fails += 1
        delay = min(MAX_BACKOFF, 2.0 ** min(e.fails - 1, 16)) * _jitter(peer)
        e.next_try = now + delay
        return delay

    def due(self, now: float, exclude: set[str], limit: int) -> list[tuple[str, list[str]]]:
        """Up to ``limit`` peers to dial now: not refused, not in ``exclude`` (connected), backoff elapsed,
        bootstrap peers first, then the most recently seen. Forgets long-unseen peers."""
        for p in [p for p, e in self.peers.items()
                  if not e.bootstrap and not e.refused and now - e.last_seen > FORGET_AFTER]:
            del self.peers[p]
        ready = [(not e.bootstrap, -e.last_seen, p) for p, e in self.peers.items()
                 if not e.refused and p not in exclude and e.addrs and e.next_try <= now]
        return [(p, list(self.peers[p].addrs)) for _, _, p in sorted(ready)[:limit]]

    def sample(self, limit: int, prefer: set[str]) -> list[tuple[str, list[str]]]:
        """Up to ``limit`` known (not refused) peers with addresses, those in ``prefer`` (connected) first."""
        rows = sorted(((p not in prefer, -e.last_seen, p) for p, e in self.peers.items()
                       if not e.refused and e.addrs))
        return [(p, list(self.peers[p].addrs)) for _, _, p in rows[:limit]]
