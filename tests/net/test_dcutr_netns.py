"""DCUtR upgrades a relayed connection to a direct one (node.net.relay in real processes, one per namespace).

The realistic case: a server S behind a NAT (outbound only) holds a reservation on a public relay R; a public
node C reaches S through R's circuit. S's DCUtR sees a relayed-only peer and dials C's own address (py-libp2p
0.8.1's unilateral upgrade, dcutr.py:488), so C and S end up directly connected and new streams use that
connection. (Two peers both behind port-mapping NATs that reset unsolicited SYNs cannot hole-punch: see
shared/notes/py-libp2p-network.md §3.)"""

from __future__ import annotations

import time

import pytest

from tests.net.relay_proc import RelayProc

pytestmark = [pytest.mark.netns, pytest.mark.slow]  # three processes in namespaces: ~11 s


def _direct(conns: list[dict]) -> list[dict]:
    return [c for c in conns if c["addrs"] and not any("/p2p-circuit" in a for a in c["addrs"])]


def test_a_relayed_connection_to_a_server_behind_nat_becomes_direct(netns):
    r_host, c_host, s_host = netns.add_host("r"), netns.add_host("c"), netns.add_nat_host("s")
    r = RelayProc(netns, r_host, seed=1, hop=True)
    s = RelayProc(netns, s_host, seed=2, dcutr=True)
    c = RelayProc(netns, c_host, seed=3, dcutr=True)

    assert s.command({"op": "connect", "addr": r.addr, "relay": True}, 20)["relays"] == [r.peer]
    res = s.command({"op": "reserve"}, 30)
    assert res["ok"] and res["circuit"] == [f"{r.addr.rsplit('/p2p/', 1)[0]}/p2p/{r.peer}/p2p-circuit"], res
    assert c.command({"op": "connect", "addr": r.addr, "relay": True}, 20)["ok"]

    # C cannot reach S directly (nothing is forwarded inward) and has never been connected to it: it dials the
    # circuit, and right then its only connection to S is the relayed one
    dial = c.command({"op": "dial", "addr": f"{res['circuit'][0]}/p2p/{s.peer}"}, 40)
    assert dial["ok"], (dial, c.stderr_tail())
    assert dial["conns"] and not _direct(dial["conns"]), dial

    # DCUtR (S drives it every 2 s; it dials C directly): a direct connection appears, from S's router address
    deadline = time.monotonic() + 30
    direct: list[dict] = []
    while time.monotonic() < deadline and not direct:
        time.sleep(0.5)
        direct = _direct(c.command({"op": "conns", "peer": s.peer}, 10)["conns"])
    assert direct, (c.command({"op": "conns", "peer": s.peer}, 10), s.stderr_tail())
    assert direct[0]["addrs"] == [f"/ip4/{s_host.public_ip}/tcp/{direct[0]['remote'][1]}"], direct
    assert direct[0]["remote"][0] == s_host.public_ip, direct

    # and streams now go over it: S sees C's request come from C's own address, not through the relay
    reply = c.command({"op": "request", "peer": s.peer, "msg": {"n": 1}, "timeout": 10}, 20)
    assert reply["ok"], reply
    assert reply["reply"]["from"] == c.peer and reply["reply"]["remote"][0] == c_host.ip, reply
