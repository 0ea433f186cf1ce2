"""Shunning (issue 23, check 3): a source refused too often has its SYNs dropped in the kernel for a while.

The policy (:class:`node.p2p.shun.ShunList`) with a fake clock; the filter (:mod:`node.p2p.synfilter`) on real
listening sockets on loopback; and the two together in front of a real P2PHost: a churn from one address gets it
shunned (its connects go unanswered, no accept, no task), a fresh peer from another address connects meanwhile, and
once the shun ends by itself a fresh peer from the shunned address connects again (nothing outlives its cause).
"""

from __future__ import annotations

import ipaddress
import socket

import pytest
import trio

from node.p2p.admission import Admission, AdmissionLimits
from node.p2p.shun import ShunList, ShunPolicy
from node.p2p.synfilter import MAX_PREFIXES, attach, compile_filter
from tests.net.test_admission import _port, fresh_peer, node, settled
from tests.net.test_admission_listener import churn
from tests.p2p.util import run

ATTACKER = "127.0.0.8"
OTHER = "127.0.1.10"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------------------------------------- the policy


def test_a_source_is_shunned_only_when_refused_often_within_one_second():
    clock = Clock()
    s = ShunList(ShunPolicy(after=5, seconds=10.0), clock)
    for _ in range(4):
        assert not s.refused("10.0.0.7", subnet=False)
        clock.t += 0.3  # 4 refusals over 1.2 s: never 5 within one second
    assert len(s) == 0 and s.version == 0
    clock.t = 2000.0
    assert [s.refused("10.0.0.7", subnet=False) for _ in range(5)] == [False] * 4 + [True]
    assert s.prefixes() == [ipaddress.ip_network("10.0.0.7/32")] and s.version == 1 and s.shuns == 1
    assert not s.refused("10.0.0.7", subnet=False)  # already shunned: not counted again
    assert s.expire() == pytest.approx(10.0)
    clock.t += 10.0
    assert s.expire() is None and len(s) == 0 and s.prefixes() == [] and s.version == 2


def test_reserved_addresses_and_subnets_holding_one_are_never_shunned():
    clock = Clock()
    reserved = {"10.0.0.9"}
    s = ShunList(ShunPolicy(after=2), clock, reserved=lambda ip: ip in reserved, reserved_ips=lambda: reserved)
    assert not any(s.refused("10.0.0.9", subnet=False) for _ in range(10))
    assert not any(s.refused("10.0.0.0/24", subnet=True) for _ in range(10))
    assert [s.refused("10.0.1.0/24", subnet=True) for _ in range(2)] == [False, True]
    assert s.prefixes() == [ipaddress.ip_network("10.0.1.0/24")]
    s.lift_covering("10.0.1.77")  # the node reserved an address inside the shunned subnet
    assert len(s) == 0


def test_the_tables_are_bounded_and_zero_turns_shunning_off():
    clock = Clock()
    s = ShunList(ShunPolicy(after=1, max_entries=3, max_tracked=5), clock)
    assert [s.refused(f"10.0.0.{i}", subnet=False) for i in range(6)] == [True] * 3 + [False] * 3
    assert len(s) == 3 and len(s._counts) <= 5
    off = ShunList(ShunPolicy(after=0), clock)
    assert not any(off.refused("10.0.0.1", subnet=False) for _ in range(1000)) and len(off) == 0
    for bad in (dict(after=-1), dict(seconds=0.0), dict(max_entries=0), dict(max_entries=MAX_PREFIXES + 1)):
        with pytest.raises(ValueError):
            ShunPolicy(**bad)
    with pytest.raises(ValueError):
        AdmissionLimits(shun_seconds=-1.0)


def test_admission_charges_refusals_to_the_address_or_the_subnet():
    clock = Clock()
    adm = Admission(AdmissionLimits(accept_rate=1.0, accept_burst=1, subnet_accept_rate=100.0,
                                    subnet_accept_burst=1000, shun_after=3), clock=clock)
    assert adm.accept("10.0.0.5") is not None
    assert [adm.accept("10.0.0.5") for _ in range(3)] == [None] * 3  # rate per IP: charged to the address
    assert adm.shun.prefixes() == [ipaddress.ip_network("10.0.0.5/32")]
    assert adm.stats()["shunned_now"] == 1 and adm.stats()["shuns"] == 1
    adm.reserve_ip("10.0.0.5")  # reserving lifts the shun
    assert len(adm.shun) == 0


# ---------------------------------------------------------------------------------------------- the filter


def _connects(src: str, port: int, dst: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    c = socket.socket(fam, socket.SOCK_STREAM)
    c.settimeout(timeout)
    try:
        if src:
            c.bind((src, 0))
        c.connect((dst, port))
        return True
    except TimeoutError:
        return False
    finally:
        c.close()


def test_the_filter_drops_syns_of_listed_prefixes_only():
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    port = ls.getsockname()[1]
    try:
        nets = [ipaddress.ip_network(n) for n in ("127.0.0.2/32", "127.0.5.0/24", "fe80::/64")]
        assert attach(ls, nets)
        got = {ip: _connects(ip, port) for ip in ("127.0.0.1", "127.0.0.2", "127.0.5.3", "127.0.5.250",
                                                   "127.0.6.1")}
        assert got == {"127.0.0.1": True, "127.0.0.2": False, "127.0.5.3": False, "127.0.5.250": False,
                       "127.0.6.1": True}
        conn, _ = ls.accept()  # a connection accepted before a later filter keeps working
        assert attach(ls, [ipaddress.ip_network("127.0.0.1/32")])
        assert not _connects("127.0.0.1", port)
        assert attach(ls, [])  # detached: everyone again
        assert all(_connects(ip, port) for ip in ("127.0.0.1", "127.0.0.2", "127.0.5.3"))
        conn.close()
        many = [ipaddress.ip_network(f"2001:db8:{i:x}::/48") for i in range(MAX_PREFIXES)]
        assert attach(ls, many)  # the largest program is within the kernel's instruction limit
        assert _connects("127.0.0.2", port)
        with pytest.raises(ValueError):
            compile_filter([*many, ipaddress.ip_network("10.0.0.0/8")])
    finally:
        ls.close()


def test_the_filter_on_ipv6():
    try:
        ls = socket.socket(socket.AF_INET6)
        ls.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    ls.listen(8)
    port = ls.getsockname()[1]
    try:
        assert attach(ls, [ipaddress.ip_network("::1/128")])
        assert not _connects("", port, "::1")
        assert attach(ls, [ipaddress.ip_network("::2/128"), ipaddress.ip_network("127.0.0.0/8")])
        assert _connects("", port, "::1")
    finally:
        ls.close()


# ---------------------------------------------------------------------------------------------- a real node


def test_a_churning_address_is_shunned_in_the_kernel_and_let_back_after():
    limits = AdmissionLimits(accept_rate=2.0, accept_burst=8, pending_per_ip=8, shun_after=32, shun_seconds=8.0)

    async def main():
        async with node(admission=limits) as (a, na):
            port = _port(a)
            got = await trio.to_thread.run_sync(churn, ATTACKER, port, 200, 3.0)
            assert a.admission.shun.shuns == 1, (got, a.admission.refused)
            assert a.admission.shun.prefixes() == [ipaddress.ip_network(f"{ATTACKER}/32")]
            assert got["reset"] >= 32 and got["silent"] >= 1, got  # refused, then its SYNs went unanswered
            refused = sum(a.admission.refused.values())
            # while the shun lasts: the attacker's connects are dropped before any accept, others are served
            assert not await trio.to_thread.run_sync(_connects, ATTACKER, port)
            assert sum(a.admission.refused.values()) == refused  # the node never saw that connection
            await fresh_peer(a, na, OTHER)
            await settled(a)
            # the shun ends by itself and the attacker's address is served again
            left = a.admission.shun.expire()
            assert left is not None and 0 < left <= 8.0
            await trio.sleep(left + 0.5)
            await fresh_peer(a, na, ATTACKER, within=15.0)
            assert a.admission.stats()["shunned_now"] == 0 and a.admission.stats()["shuns"] == 1

    run(main, timeout=120)
