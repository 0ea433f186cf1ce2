"""py-libp2p's peerstore, bounded the way Tally needs (issue 39, "Bounded tables").

py-libp2p 0.8.1 keeps a ``PeerData`` (addresses, protocols, keys, metadata) for every peer it hears of: connected
peers (Noise, identify) and every address Tally hands it (:meth:`node.p2p.dialing.DialMethods.remember`, from
presence gossip and peer exchange). Its ``PeerStore`` caps that map at ``max_peers`` (1000) when addresses are
added, but its eviction (``_enforce_peer_limit``) removes entries *without addresses first*, and the host's own
entry -- its key pair, no address -- is one: past 1000 peers heard, a node loses its own private key from the
peerstore, and ``host.get_private_key()`` (identify, a new signed peer record, relay vouchers) raises
``PeerStoreError``. It also sorts the whole map on every insert beyond the cap.

:func:`bounded_peerstore` is that ``PeerStore`` with another eviction, run when an insert takes the map past
:data:`MAX_PEERS`:

* never evicted: entries holding a private key (the host's own) and peers ``keep(peer_id)`` says to keep (the
  host sets it to "has an open connection");
* evicted first: entries whose addresses expired (py-libp2p's TTLs: 120 s for what Tally remembers, 2 h for what
  identify learns) or that have none, then the entries refreshed longest ago (``last_identified``), ties in
  insertion order;
* :data:`SLACK` more entries than needed go at once, so the sort runs once per :data:`SLACK` new peers (amortized
  O(log n) per insert).

Addresses are not cleared at disconnect: a disconnected peer's addresses carry their TTL and are the first to go
once expired. py-libp2p's periodic ``start_cleanup_task`` is not run: it would delete expired entries whole,
protocols and keys of connected peers included.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from libp2p.peer.id import ID
    from libp2p.peer.peerstore import PeerStore

__all__ = ["MAX_PEERS", "SLACK", "SLACK_SHARE", "bounded_peerstore", "peerstore_class"]

MAX_PEERS = 2048  # peers the peerstore holds at most (beyond those kept: own entry, connected peers); the address
# book's 1024 (node.net.peers.MAX_PEERS) plus connected peers fit without evicting a live one
SLACK_SHARE = 8  # max_peers // SLACK_SHARE entries are evicted beyond the bound at once (one sort per that many)
SLACK = MAX_PEERS // SLACK_SHARE


@cache
def peerstore_class() -> type[PeerStore]:
    """py-libp2p's ``PeerStore`` with Tally's bound and eviction (module docstring), constructed as
    ``cls(keep, max_peers, slack)``; use :func:`bounded_peerstore`. Its ``evicted`` counts entries evicted."""
    # local: py-libp2p takes ~1.3 s to import; it loads when a host starts, not with every CLI command
    from libp2p.peer.peerstore import PeerStore

    class TallyPeerStore(PeerStore):
        def __init__(self, keep: Callable[[ID], bool], max_peers: int, slack: int) -> None:
            super().__init__(max_peers=max_peers)
            self.keep, self.slack = keep, slack
            self.evicted = 0

        def _enforce_peer_limit(self) -> None:
            over = len(self.peer_data_map) - self.max_peers
            if over <= 0:
                return
            ranked = sorted(
                (not pd.is_expired() and bool(pd.get_addrs()), pd.last_identified, i, pid)
                for i, (pid, pd) in enumerate(self.peer_data_map.items())
                if pd.privkey is None and not self.keep(pid))
            for *_rank, pid in ranked[:over + self.slack]:
                self.peer_record_map.pop(pid, None)
                del self.peer_data_map[pid]
                self.evicted += 1

    return TallyPeerStore


def bounded_peerstore(keep: Callable[[ID], bool] = lambda _pid: False, max_peers: int = MAX_PEERS,
                      slack: int | None = None) -> PeerStore:
    """A peerstore of at most ``max_peers`` entries beyond those kept (module docstring). ``keep(peer_id)``: never
    evict that peer (the host: it has an open connection); ``slack``: entries evicted beyond the bound at once
    (default ``max_peers // SLACK_SHARE``)."""
    cls: Callable[[Callable[[ID], bool], int, int], PeerStore] = peerstore_class()  # the subclass's signature
    return cls(keep, max_peers, max(0, max_peers // SLACK_SHARE if slack is None else slack))
