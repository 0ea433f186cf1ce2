"""Admission before the handshake and bounded per-identity state, driven directly (pure objects, a test clock).

The real-socket side is tests/net/test_admission.py; here the counts are checked exactly, and 5,000 fresh
identities (``Identity.generate()``) go through the limiter, the hello, the address book and the score table to
show that none of them grows with the number of identities ever seen.
"""

from __future__ import annotations

import pytest
import trio

from node.identity import Identity
from node.net.hello import MAX_OBSERVED, MAX_TRACKED, Hello
from node.net.peers import MAX_PEERS, PeerBook
from node.p2p.admission import Admission, AdmissionLimits, Refusal, subnet_of
from node.p2p.limits import Limits, PeerLimiter
from node.p2p.scoring import PeerScores

G = b"\x01" * 32


def test_subnets_are_slash24_and_slash56():
    assert subnet_of("127.0.0.2") == subnet_of("127.0.0.200") == "127.0.0.0/24"
    assert subnet_of("127.0.1.5") == "127.0.1.0/24"
    assert subnet_of("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert subnet_of("2001:db8:0:12ff::1") == subnet_of("2001:db8:0:1200::9") == "2001:db8:0:1200::/56"
    assert subnet_of("2001:db8:0:1300::1") != subnet_of("2001:db8:0:1200::1")
    with pytest.raises(ValueError):
        AdmissionLimits(reserved=128, pending_total=128)


def test_pending_and_open_caps_per_ip_subnet_and_total_and_counts_come_back():
    t = [0.0]
    adm = Admission(AdmissionLimits(open_per_ip=4, open_per_subnet=6, open_total=10, pending_per_ip=2,
                                    pending_per_subnet=3, pending_total=8, reserved=2, accept_rate=1000,
                                    accept_burst=1000), clock=lambda: t[0])
    a = [adm.accept("10.0.0.1") for _ in range(3)]
    assert a[2] is None and adm.refused[Refusal.PENDING_IP.value] == 1  # 2 pending from one IP at most
    b = adm.accept("10.0.0.2")
    assert adm.accept("10.0.0.3") is None and adm.refused[Refusal.PENDING_SUBNET.value] == 1
    d = adm.accept("10.0.1.1")
    assert d is not None  # another /24 is not affected
    for x in (a[0], a[1], b):
        x.upgraded("peer")  # no longer pending: counted as open only
    c = [adm.accept("10.0.0.1") for _ in range(3)]
    assert c[0] and c[1] and c[2] is None and adm.refused[Refusal.OPEN_IP.value] == 1  # 4 open per IP
    assert adm.open == 6 and adm.pending == 3
    # totals: 10 open of which 2 reserved; reserved IPs skip per-IP and per-subnet caps
    adm.reserve_ip("10.0.0.1")
    for x in c[:2]:
        x.upgraded("peer")
    extra = [adm.accept(f"10.0.{i}.9") for i in range(2, 4)]
    assert all(extra) and adm.open == 8
    assert adm.accept("10.0.9.9") is None and adm.refused[Refusal.OPEN_TOTAL.value] == 1
    r = [adm.accept("10.0.0.1") for _ in range(3)]
    assert r[0] and r[1] and r[2] is None  # the reserved slots, then the hard total
    for x in [*a[:2], b, *c[:2], *extra, *r[:2]]:
        x.close()
        x.close()  # idempotent
    assert adm.open == 1 and adm.pending == 1  # the one from 10.0.1.1, still pending
    assert set(adm.open_ip.n) == {"10.0.1.1"} and set(adm.pending_sub.n) == {"10.0.1.0/24"}


def test_accept_rate_per_ip_refills():
    t = [0.0]
    adm = Admission(AdmissionLimits(accept_rate=2.0, accept_burst=3), clock=lambda: t[0])
    got = [adm.accept("10.0.0.1") for _ in range(5)]
    assert [g is not None for g in got] == [True, True, True, False, False]
    for g in got[:3]:
        g.close()
    assert adm.refused[Refusal.RATE_IP.value] == 2
    assert adm.accept("10.0.0.2") is not None  # per IP
    t[0] += 1.0  # 2 tokens back
    assert adm.accept("10.0.0.1") is not None and adm.accept("10.0.0.1") is not None
    assert adm.accept("10.0.0.1") is None


def test_accept_rate_per_subnet_spans_its_addresses():
    t = [0.0]
    adm = Admission(AdmissionLimits(subnet_accept_rate=10.0, subnet_accept_burst=20), clock=lambda: t[0])
    got = [adm.accept(f"10.0.0.{i}") for i in range(1, 31)]  # one each from 30 addresses of one /24
    assert sum(g is not None for g in got) == 20 and adm.refused[Refusal.RATE_SUBNET.value] == 10
    assert adm.accept("10.0.1.1") is not None  # another /24
    adm.reserve_ip("10.0.0.99")
    assert adm.accept("10.0.0.99") is not None  # reserved addresses skip the rates
    t[0] += 0.5  # 5 tokens back
    assert sum(adm.accept(f"10.0.0.{i}") is not None for i in range(40, 50)) == 5


def test_five_thousand_ips_leave_no_state_behind():
    # rates out of the way (all 5000 connect at the same instant): this is about the tables' bounds
    adm = Admission(AdmissionLimits(max_tracked=1000, subnet_accept_burst=10**6, total_accept_burst=10**6))
    for i in range(5000):
        t = adm.accept(f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}")
        assert t is not None
        t.upgraded(f"p{i}")
        t.close()
    assert adm.open == adm.pending == 0
    assert not adm.open_ip.n and not adm.open_sub.n and not adm.pending_ip.n and not adm.pending_sub.n
    assert len(adm._buckets) <= 1000
    for i in range(5000):
        adm.reserve_ip(f"10.1.{i // 256}.{i % 256}")
    assert len(adm.reserved_ips) == 1000


def test_five_thousand_identities_keep_limiter_hello_book_and_scores_bounded():
    ids = [Identity.generate().peer_id for _ in range(5000)]
    t = [0.0]
    lim = PeerLimiter(Limits(max_tracked=1000, stream_burst=3, conn_rate=2, max_conns=3000), clock=lambda: t[0])
    for p in ids:
        assert lim.conn_opened(p) is None
        assert [lim.stream_opened(p) for _ in range(4)][3] is not None  # the 4th over the burst: refused
        for _ in range(3):
            lim.stream_closed(p)  # an empty bucket stays while the peer is remembered...
        assert lim.stream_opened(p) is not None  # refused with no stream open
        lim.conn_closed(p)
        assert lim.conn_opened(p) is None and lim.conn_opened(p) is not None  # over the rate: refused
        lim.conn_closed(p)
        t[0] += 0.001
    assert len(lim._conn_times) == 1000 and len(lim._buckets) == 1000  # ...among the 1,000 most recent
    assert not lim.conns and not lim.streams  # refusals leave nothing behind

    class Host:  # the HelloHost seam: a peer's reply to our hello, with the address it saw us at
        peer_id = "me"

        async def request(self, peer_id, protocol_id, msg, timeout):
            return {"chain_id": "c", "genesis": G.hex(), "agent": "x" * 100, "addrs": [],
                    "observed": f"/ip4/10.0.0.1/tcp/{len(peer_id)}"}

        def penalize(self, peer_id, weight, ban_s=None):
            return True

        def announced(self):
            return []

    hello = Hello("c", G, Host())

    async def main():
        for i, p in enumerate(ids):
            if i % 2:
                assert await hello.greet(p)
            else:
                await hello.handle({"chain_id": "c", "genesis": G.hex(), "agent": "y"}, p)
            if i % 3 == 0:  # a wrong genesis: refused and remembered, boundedly
                hello.forget(p)
                assert not hello._check(p, {"chain_id": "other", "genesis": "00"})
            with trio.move_on_after(0):
                await hello.wait_verified(f"never-{i}", timeout=0)  # waits that time out leave an event
            if i % 5:
                hello.forget(p)

    trio.run(main)
    assert len(hello.agents) == MAX_TRACKED and len(hello.observed) == MAX_OBSERVED
    assert len(hello._verified) <= MAX_TRACKED and len(hello._events) <= MAX_TRACKED
    assert len(hello.refused) <= MAX_TRACKED

    book = PeerBook()
    for i, p in enumerate(ids):
        book.add(p, [f"/ip4/10.0.{i // 256}.{i % 256}/tcp/4001"], now=float(i))
        book.failed(ids[-1 - i], now=float(i))
        book.refuse(ids[(i * 7) % 5000])
    assert len(book.peers) == MAX_PEERS

    scores = PeerScores(max_peers=1000)
    for p in ids:
        scores.penalize(p, 25.0, ban_s=60.0)  # each one banned
    assert len(scores._peers) == 1000


def test_peers_that_did_useful_work_hold_reserved_slots_until_their_vouch_ends():
    """A vouched peer (a receipt of it landed: P2PHost.vouch from the runtime) skips the per-address limits and
    takes reserved slots, and so does its IP once it connected; both end with the vouch, by themselves."""
    t = [0.0]
    adm = Admission(AdmissionLimits(open_per_ip=1, open_per_subnet=1, open_total=4, pending_per_ip=1,
                                    pending_per_subnet=1, pending_total=4, reserved=2, accept_rate=1000,
                                    accept_burst=1000), clock=lambda: t[0])
    flood = adm.accept("10.0.0.1")  # the flooder holds its subnet's only slot
    assert flood is not None and adm.accept("10.0.0.9") is None
    worker = Identity.generate().peer_id
    adm.vouch(worker, until=100.0)
    assert adm.peer_reserved(worker) == 100.0 and adm.peer_reserved("someone") == 0.0
    first = adm.accept("10.0.0.7")  # not yet known by IP: its first connection is counted like anyone's
    assert first is None
    adm.reserve_ip("10.0.0.8", until=100.0)  # as Ticket.upgraded does once the vouched peer connected from it
    tk = adm.accept("10.0.0.8")
    assert tk is not None
    tk.upgraded(worker)
    assert adm.ip_reserved("10.0.0.8")
    t[0] = 100.0  # the vouch ends: peer and IP are ordinary again, and the tables forget them
    assert adm.peer_reserved(worker) == 0.0 and worker not in adm.vouched
    assert not adm.ip_reserved("10.0.0.8") and "10.0.0.8" not in adm.reserved_ips
    tk.close()
    assert adm.accept("10.0.0.8") is None  # 10.0.0.0/24 is full again (the flooder), and no slot is kept
    lim = PeerLimiter(Limits(max_conns=1), clock=lambda: t[0])
    lim.vouched = adm.peer_reserved
    assert lim.conn_opened("a") is None and lim.conn_opened("b") is not None
    adm.vouch("b", until=200.0)
    assert lim.conn_opened("b") is None  # max_conns does not hold a vouched peer
    for i in range(2 * adm.limits.max_tracked):
        adm.vouch(f"p{i}", until=300.0)
    assert len(adm.vouched) == adm.limits.max_tracked  # bounded whatever the number of peers vouched for


def test_accept_rate_node_wide_bounds_unreserved_upgrades_from_every_subnet():
    """Many subnets at once cannot make the node compute more than ``total_accept_rate`` upgrades a second (each
    a Noise handshake and a hello: ~20 ms of CPU); reserved addresses still get in, and the bucket refills."""
    t = [0.0]
    adm = Admission(AdmissionLimits(total_accept_rate=5.0, total_accept_burst=10), clock=lambda: t[0])
    got = [adm.accept(f"10.{i}.0.1") for i in range(30)]  # 30 subnets, one connection each
    assert sum(g is not None for g in got) == 10 and adm.refused[Refusal.RATE_TOTAL.value] == 20
    adm.reserve_ip("10.99.0.1")
    assert adm.accept("10.99.0.1") is not None  # reserved addresses skip the rates
    t[0] += 1.0  # 5 tokens back
    assert sum(adm.accept(f"10.{i}.0.2") is not None for i in range(100, 110)) == 5
    # a refusal by the node-wide rate takes no token of the address's own bucket
    adm2 = Admission(AdmissionLimits(total_accept_rate=1.0, total_accept_burst=1, accept_rate=1.0, accept_burst=1),
                     clock=lambda: t[0])
    assert adm2.accept("10.0.0.1") is not None and adm2.accept("10.0.0.2") is None
    t[0] += 1.0
    assert adm2.accept("10.0.0.2") is not None
