"""Hole punching between two peers that are each behind a NAT of their own (issue 25, check 1's NAT part).

R is a public relay; S and C are each behind a home-router NAT that silently drops unsolicited inbound TCP
(``stealth``). Both reserve on R; C dials S through R's circuit; DCUtR (both ends dial each other from their
listen ports after the SYNC message: TCP simultaneous open) must then give a direct connection where the NATs keep
source ports (endpoint-independent mapping), and must not where they pick a random port per connection
(``masquerade random``): there the relayed connection stays and keeps carrying requests."""

from __future__ import annotations

import time

import pytest

from tests.net.relay_proc import RelayProc

pytestmark = [pytest.mark.netns, pytest.mark.slow]  # four processes in namespaces, up to ~60 s


def _direct(conns: list[dict]) -> list[dict]:
    return [c for c in conns if c["addrs"] and not any("/p2p-circuit" in a for a in c["addrs"])]


def _setup(netns, random_ports: bool):
    r_host = netns.add_host("r")
    s_host = netns.add_nat_host("s", stealth=True, random_ports=random_ports)
    c_host = netns.add_nat_host("c", stealth=True, random_ports=random_ports)
    r = RelayProc(netns, r_host, seed=1, hop=True)
    s = RelayProc(netns, s_host, seed=2, dcutr=True)
    c = RelayProc(netns, c_host, seed=3, dcutr=True)
    for p in (s, c):
        assert p.command({"op": "connect", "addr": r.addr, "relay": True}, 20)["relays"] == [r.peer]
    res = s.command({"op": "reserve"}, 30)
    assert res["ok"], res
    dial = c.command({"op": "dial", "addr": f"{res['circuit'][0]}/p2p/{s.peer}"}, 40)
    assert dial["ok"], (dial, c.stderr_tail())
    assert dial["conns"] and not _direct(dial["conns"]), dial
    return r, s, c, s_host, c_host


def _wait_direct(c, s, seconds: float) -> list[dict]:
    deadline = time.monotonic() + seconds
    direct: list[dict] = []
    while time.monotonic() < deadline and not direct:
        time.sleep(0.5)
        direct = _direct(c.command({"op": "conns", "peer": s.peer}, 10)["conns"])
    return direct


def test_two_peers_behind_port_preserving_nats_end_up_directly_connected(netns):
    _r, s, c, s_host, c_host = _setup(netns, random_ports=False)
    direct = _wait_direct(c, s, 45)
    assert direct, (c.command({"op": "conns", "peer": s.peer}, 10), s.stderr_tail(), c.stderr_tail())
    assert direct[0]["remote"][0] == s_host.public_ip, direct
    reply = c.command({"op": "request", "peer": s.peer, "msg": {"n": 1}, "timeout": 10}, 20)
    assert reply["ok"], reply
    # S sees the request come from C's router, not from the relay
    assert reply["reply"]["remote"][0] == c_host.public_ip, reply


def test_behind_random_port_nats_the_relayed_connection_stays_and_works(netns):
    _r, s, c, _s_host, c_host = _setup(netns, random_ports=True)
    assert not _wait_direct(c, s, 20)
    reply = c.command({"op": "request", "peer": s.peer, "msg": {"n": 2}, "timeout": 10}, 20)
    assert reply["ok"], reply
    assert reply["reply"]["remote"] is None or reply["reply"]["remote"][0] != c_host.public_ip, reply
