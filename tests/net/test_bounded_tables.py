"""Issue 39, "Bounded tables": every per-peer table fixed for it is driven with ten times more peers than its bound
and never grows past it; expired entries go first; live, useful entries survive where the rule says so.

Tables: the swarm table's announcements and round trips (:mod:`node.inference.swarm`), py-libp2p's peerstore as
Tally bounds it (:mod:`node.p2p.peerstore`), the dial-back server's per-peer times (:mod:`node.net.reachability`)
and the network service's per-connected-peer sets (:mod:`node.net.service`).
"""

from __future__ import annotations

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStore

from node.encoding import pack
from node.identity import Identity
from node.inference import swarm as swarm_mod
from node.inference.swarm import MAX_PEERS, MAX_RTT_PEERS, MAX_TTL, SwarmTable
from node.net import reachability
from node.net.reachability import DialBackServer
from node.net.service import NetworkService
from node.p2p import peerstore as ps_mod
from node.p2p.host import P2PHost
from node.p2p.peerstore import bounded_peerstore

MID = b"m" * 32


def _ann(peer: str, seq: int = 1, ttl: float = 60.0) -> bytes:
    return pack({"peer": peer, "model_id": MID, "start": 0, "end": 4, "seq": seq, "ttl": ttl})


def _feed(table: SwarmTable, rows: list[tuple[str, int, float]], now: list[float] | None = None,
          step: float = 0.0, cap: int | None = None) -> int:
    """Announce each ``(peer, seq, ttl)`` in order (the fake clock advancing ``step`` s per message); returns the
    largest table size seen, which must stay within ``cap`` after every message."""
    biggest = 0

    async def main() -> None:
        nonlocal biggest
        for peer, seq, ttl in rows:
            await table.on_announcement(_ann(peer, seq, ttl), peer)
            biggest = max(biggest, len(table.entries))
            assert cap is None or len(table.entries) <= cap
            if now is not None:
                now[0] += step

    trio.run(main)
    return biggest


def test_swarm_table_holds_at_most_max_peers_under_a_flood_of_ten_times_as_many():
    now = [0.0]
    table = SwarmTable(clock=lambda: now[0])
    rows = [(f"p{i}", 1, 60.0) for i in range(10 * MAX_PEERS)]
    assert _feed(table, rows, now, step=0.01, cap=MAX_PEERS) == MAX_PEERS
    assert table.evicted + table.dropped > 0


def test_swarm_table_prunes_expired_entries_on_insert():
    """Peers announcing a 10 s ttl, one every 0.01 s: about 1,000 are live at a time, and the table holds no more
    than those (plus the one just heard), far below its cap."""
    now = [0.0]
    table = SwarmTable(clock=lambda: now[0])
    rows = [(f"p{i}", 1, 10.0) for i in range(5000)]
    biggest = _feed(table, rows, now, step=0.01)
    assert biggest <= 1001
    now[0] += MAX_TTL
    table.live(MID)  # a read prunes too
    assert len(table.entries) == 0


def test_a_full_table_evicts_expired_entries_before_live_ones():
    now = [0.0]
    table = SwarmTable(clock=lambda: now[0], max_peers=100)
    # 50 long-lived honest servers, then 50 that announce a 1 s ttl, so the table is full
    _feed(table, [(f"h{i}", 1, 300.0) for i in range(50)] + [(f"s{i}", 1, 1.0) for i in range(50)], now, 0.0)
    assert len(table.entries) == 100
    now[0] += 2.0  # the short ones expired; the head (h0) did not, so the cheap head pruning alone frees nothing
    _feed(table, [(f"n{i}", 1, 300.0) for i in range(50)], now, 0.0, cap=100)
    assert {p for p in table.entries if p.startswith("h")} == {f"h{i}" for i in range(50)}
    assert not any(p.startswith("s") for p in table.entries)
    assert table.evicted == 0


def test_a_flood_of_new_peer_ids_evicts_few_live_entries():
    """A full table of live servers, then ten times its size in fresh ids at once: at most max_peers // 8 live
    entries give way (the rest of the flood is dropped); refreshes of known servers are still taken."""
    now = [0.0]
    cap = 256
    table = SwarmTable(clock=lambda: now[0], max_peers=cap)
    _feed(table, [(f"h{i:03}", 1, 300.0) for i in range(cap)], now, 0.0)
    _feed(table, [(f"x{i}", 1, 300.0) for i in range(10 * cap)], now, 0.001, cap=cap)
    honest = {p for p in table.entries if p.startswith("h")}
    assert len(honest) >= cap - cap // swarm_mod.LIVE_EVICTION_SHARE - 1
    assert table.evicted <= cap // swarm_mod.LIVE_EVICTION_SHARE + 1
    assert table.dropped >= 10 * cap - cap // swarm_mod.LIVE_EVICTION_SHARE - 1
    survivor = sorted(honest)[-1]
    _feed(table, [(survivor, 2, 300.0)], now, 0.0, cap=cap)  # a refresh, table full: taken
    assert table.entries[survivor]["seq"] == 2
    # the budget refills over MAX_TTL: new peers get in again, evicting the entry heard longest ago
    now[0] += MAX_TTL
    oldest = next(iter(table.entries))
    _feed(table, [("late", 1, 300.0)], now, 0.0, cap=cap)
    assert "late" in table.entries and oldest not in table.entries


def test_swarm_rtt_table_is_bounded_and_keeps_the_recently_measured():
    table = SwarmTable()
    table.observe_rtt("keep", 0.05)
    for i in range(10 * MAX_RTT_PEERS):
        table.observe_rtt(f"p{i}", 0.01)
        if i % 1000 == 0:
            table.observe_rtt("keep", 0.05)  # measured again and again: never the least recent
        assert len(table.rtt) <= MAX_RTT_PEERS
    assert len(table.rtt) == MAX_RTT_PEERS
    assert "keep" in table.rtt and "p0" not in table.rtt and f"p{10 * MAX_RTT_PEERS - 1}" in table.rtt


# ---------------------------------------------------------------------- py-libp2p's peerstore


def _pid() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


def _addr(i: int) -> list[multiaddr.Multiaddr]:
    return [multiaddr.Multiaddr(f"/ip4/10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}/tcp/4001")]


def test_stock_peerstore_evicts_its_own_key_past_its_cap():
    """Why Tally bounds the peerstore itself: py-libp2p 0.8.1 evicts address-less entries first, the host's own
    key pair among them (then ``host.get_private_key()`` raises)."""
    store = PeerStore(max_peers=10)
    kp = create_new_key_pair()
    me = ID.from_pubkey(kp.public_key)
    store.add_key_pair(me, kp)
    for i in range(11):
        store.add_addrs(_pid(), _addr(i), 120)
    assert me not in store.peer_data_map


def test_bounded_peerstore_keeps_own_key_and_connected_peers_under_a_flood():
    cap = 50
    connected = {_pid() for _ in range(5)}
    store = bounded_peerstore(keep=lambda pid: pid in connected, max_peers=cap)
    kp = create_new_key_pair()
    me = ID.from_pubkey(kp.public_key)
    store.add_key_pair(me, kp)
    for i, pid in enumerate(connected):
        store.add_addrs(pid, _addr(100_000 + i), 7200)
        store.add_protocols(pid, ["/meshsub/1.1.0"])
    last: list[ID] = []
    for i in range(10 * cap):
        pid = _pid()
        store.add_addrs(pid, _addr(i), 120)
        last = [*last[-9:], pid]
        assert len(store.peer_data_map) <= cap + 1 + len(connected)
    assert store.privkey(me) == kp.private_key
    assert all(store.get_protocols(p) == ["/meshsub/1.1.0"] for p in connected)
    assert all(store.addrs(p) for p in last)  # the most recently heard stay


def test_bounded_peerstore_evicts_expired_addresses_first():
    store = bounded_peerstore(max_peers=20, slack=0)
    old = [_pid() for _ in range(19)]
    for i, pid in enumerate(old):
        store.add_addrs(pid, _addr(i), 0)  # no ttl: never expire
        store.peer_data_map[pid].last_identified -= 10_000  # refreshed long ago
    stale = _pid()
    store.add_addrs(stale, _addr(50), 120)
    store.peer_data_map[stale].last_identified -= 1000  # refreshed after the others, but its 120 s ttl is over
    store.add_addrs(_pid(), _addr(99), 120)
    assert stale not in store.peer_data_map and len(store.peer_data_map) == 20
    assert all(p in store.peer_data_map for p in old)


def test_host_runs_with_the_bounded_peerstore():
    async def main() -> None:
        host = P2PHost(Identity.generate(), 0, "test-chain")
        async with host.running():
            store = host.libp2p.get_peerstore()
            assert type(store) is ps_mod.peerstore_class() and store.max_peers == ps_mod.MAX_PEERS
            assert store.privkey(host.libp2p.get_id()) is not None

    async def bounded() -> None:
        with trio.fail_after(20):
            await main()

    trio.run(bounded)


# ---------------------------------------------------------------------- node.net


class _NoDial:
    async def dial_fresh(self, peer: str, addr: str, timeout: float) -> bool:
        return False


def test_dialback_times_are_bounded_and_forgotten_once_they_limit_nothing():
    now = [0.0]
    server = DialBackServer(_NoDial(), clock=lambda: now[0])
    msg = {"addrs": ["/ip4/10.0.0.1/tcp/1"]}

    async def main() -> None:
        for i in range(10 * reachability.MAX_TRACKED):
            await server.handle(msg, f"p{i}", ("10.9.9.9", 1))
            assert len(server._last) <= reachability.MAX_TRACKED
        now[0] += reachability.PER_PEER_INTERVAL
        await server.handle(msg, "late", ("10.9.9.9", 1))
        assert list(server._last) == ["late"]

    trio.run(main)


@pytest.fixture
def service(monkeypatch):
    host = P2PHost(Identity.generate(), 0, "test-chain")  # never started: connected_peers() is []
    svc = NetworkService(host, b"g" * 32)
    monkeypatch.setattr(P2PHost, "libp2p", property(lambda self: None))
    return svc


def test_a_peer_gone_during_its_ping_leaves_no_miss_count(service):
    async def failed_ping(host, pid):
        return None

    service.paths.measure = failed_ping
    peer = Identity.generate().peer_id
    trio.run(service._ping_one, peer)
    assert service._ping_fails == {}


def test_a_peer_gone_during_its_hello_is_not_marked_exchanged(service):
    async def ok(peer):
        return True

    service.hello.greet = ok
    trio.run(service._greet, Identity.generate().peer_id)
    assert service._exchanged == set()
