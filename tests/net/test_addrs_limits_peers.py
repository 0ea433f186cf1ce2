"""The pure parts of node.net: which addresses are announced, per-peer limits, the address book's backoff."""

from __future__ import annotations

import pytest

from node.net.peers import MAX_BACKOFF, PeerBook
from node.p2p.addrs import (
    AddrError,
    Scope,
    announceable,
    default_listen,
    expand,
    parse_addr,
    scope,
    strip_peer,
    usable_from,
)
from node.p2p.limits import Limits, PeerLimiter

P = "12D3KooWRcNPtNp97U5hzRFZcN4eP4CsUScKtjSEtqXbAZKJ9p4N"
R = "12D3KooWSb8MMzSsKLLjEZDtwCKiaj2VMzoHgmeh5H6hZv44ijQV"


@pytest.mark.parametrize("addr,s", [
    ("/ip4/127.0.0.1/tcp/1", Scope.LOOPBACK), ("/ip4/0.0.0.0/tcp/1", Scope.WILDCARD),
    ("/ip6/::/tcp/1", Scope.WILDCARD), ("/ip6/::1/tcp/1", Scope.LOOPBACK), ("/ip4/10.1.2.3/tcp/1", Scope.PRIVATE),
    ("/ip4/192.168.1.2/tcp/1", Scope.PRIVATE), ("/ip4/100.64.0.1/tcp/1", Scope.PRIVATE),
    ("/ip4/8.8.8.8/tcp/1", Scope.PUBLIC), ("/ip6/2001:4860::1/tcp/1", Scope.PUBLIC),
    ("/ip6/fe80::1/tcp/1", Scope.LINK_LOCAL), ("/dns4/example.org/tcp/1", Scope.DNS),
    (f"/ip4/8.8.8.8/tcp/1/p2p/{R}/p2p-circuit", Scope.RELAY)])
def test_scope(addr, s):
    assert scope(addr) is s


def test_parse_addr_refuses_what_cannot_work():
    assert parse_addr("/ip4/0.0.0.0/tcp/4001", for_listen=True) == "/ip4/0.0.0.0/tcp/4001"
    assert parse_addr("/dns4/node.example.org/tcp/4001", for_listen=False) == "/dns4/node.example.org/tcp/4001"
    for bad, listen in (("/ip4/0.0.0.0/tcp/4001", False), ("/ip4/1.2.3.4/udp/1", True), ("nonsense", True),
                        ("/dns4/x/tcp/1", True), ("/ip4/1.2.3.4/tcp/0", False), (f"/ip4/1.2.3.4/tcp/1/p2p/{P}", True)):
        with pytest.raises(AddrError):
            parse_addr(bad, for_listen=listen)


def test_wildcards_expand_to_interfaces_and_loopback_only_for_loopback_nodes():
    ips = ["127.0.0.1", "10.0.0.5", "::1", "2001:db8::5"]
    assert expand(["/ip4/0.0.0.0/tcp/4001"], ips) == ["/ip4/127.0.0.1/tcp/4001", "/ip4/10.0.0.5/tcp/4001"]
    got = announceable([], ["/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001"], ips=ips)
    assert got == ["/ip4/10.0.0.5/tcp/4001", "/ip6/2001:db8::5/tcp/4001"]  # never loopback, never wildcard
    assert announceable([], ["/ip4/127.0.0.1/tcp/5"], ips=ips) == ["/ip4/127.0.0.1/tcp/5"]  # the devnet
    relay = f"/ip4/10.0.0.9/tcp/4001/p2p/{R}/p2p-circuit"
    got = announceable(["/dns4/me.example.org/tcp/4001"], ["/ip4/0.0.0.0/tcp/4001"],
                       confirmed=["/ip4/203.0.113.7/tcp/4001"], relayed=[relay], ips=ips)
    assert got == ["/dns4/me.example.org/tcp/4001", "/ip4/203.0.113.7/tcp/4001", relay, "/ip4/10.0.0.5/tcp/4001"]


def test_remote_addresses_filtered_and_peer_suffix_stripped():
    addrs = ["/ip4/0.0.0.0/tcp/1", "/ip4/127.0.0.1/tcp/2", "/ip4/10.0.0.2/tcp/3", "/ip6/fe80::1/tcp/4"]
    assert usable_from(addrs, {Scope.PRIVATE}) == ["/ip4/10.0.0.2/tcp/3"]
    assert usable_from(addrs, {Scope.LOOPBACK}) == ["/ip4/127.0.0.1/tcp/2", "/ip4/10.0.0.2/tcp/3"]
    assert strip_peer(f"/ip4/1.2.3.4/tcp/1/p2p/{P}") == "/ip4/1.2.3.4/tcp/1"
    assert strip_peer(f"/ip4/1.2.3.4/tcp/1/p2p/{R}/p2p-circuit/p2p/{P}") == f"/ip4/1.2.3.4/tcp/1/p2p/{R}/p2p-circuit"
    assert default_listen(4001, has_ipv6=False) == ["/ip4/0.0.0.0/tcp/4001"]
    assert default_listen(4001, has_ipv6=True) == ["/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001"]


def test_stream_limits_per_peer_concurrency_and_rate():
    t = [0.0]
    lim = PeerLimiter(Limits(streams_per_peer=3, stream_rate=10, stream_burst=5), clock=lambda: t[0])
    assert [lim.stream_opened("a") for _ in range(3)] == [None] * 3
    assert "3 streams open" in lim.stream_opened("a")
    assert lim.stream_opened("b") is None  # one peer's streams never starve another's
    for _ in range(3):
        lim.stream_closed("a")
    assert lim.stream_opened("a") is None and lim.stream_opened("a") is None  # burst of 5 used up
    lim.stream_closed("a")
    lim.stream_closed("a")
    assert "new streams/s" in lim.stream_opened("a")
    t[0] += 0.1  # one token back at 10/s
    assert lim.stream_opened("a") is None
    assert lim.refused_streams == 2


def test_connection_limits_per_peer_rate_and_total():
    t = [0.0]
    lim = PeerLimiter(Limits(conns_per_peer=2, conn_rate=4, max_conns=3), clock=lambda: t[0])
    assert lim.conn_opened("a") is None and lim.conn_opened("a") is None
    assert "per peer" in lim.conn_opened("a")
    lim.conn_closed("a")
    assert lim.conn_opened("a") is None
    lim.conn_closed("a")
    assert "in a minute" in lim.conn_opened("a")  # the 5th attempt within 60 s, though only 1 is open
    assert lim.conn_opened("b") is None and lim.conn_opened("b") is None
    assert "in all" in lim.conn_opened("c")
    lim.conn_closed("b")
    t[0] += 61
    assert lim.conn_opened("a") is None


def test_address_book_backoff_bootstrap_first_and_persistence(tmp_path):
    book = PeerBook(tmp_path / "peers.json")
    book.add(P, ["/ip4/10.0.0.2/tcp/4001"], now=100.0, bootstrap=True)
    book.add(R, ["/ip4/10.0.0.3/tcp/4001"], now=200.0)
    assert [p for p, _ in book.due(300.0, set(), 8)] == [P, R]  # bootstrap first
    delays = [book.failed(R, 300.0) for _ in range(10)]
    assert delays[1] > delays[0] and max(delays) <= MAX_BACKOFF * 1.2
    assert [p for p, _ in book.due(300.0, set(), 8)] == [P]
    book.connected(R, 301.0)
    assert [p for p, _ in book.due(301.0, {P}, 8)] == [R]
    book.refuse(R)
    book.save()
    again = PeerBook(tmp_path / "peers.json")
    assert [p for p, _ in again.due(400.0, set(), 8)] == [P]  # refused peers are never dialled again
    assert again.peers[P].bootstrap and again.peers[R].refused
    (tmp_path / "peers.json").write_text("{not json")
    assert PeerBook(tmp_path / "peers.json").peers == {}  # a damaged book is only a cache
