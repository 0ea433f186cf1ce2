"""The namespace harness with real Tally libp2p hosts (``P2PHost`` in processes inside the namespaces)."""

import subprocess
import sys

import pytest

from tests.net.netns import PREFIX, cleanup_leftovers, list_namespaces
from tests.net.peer_proc import ROOT, PeerProc

pytestmark = pytest.mark.netns


def test_two_public_hosts_round_trip_over_veth(netns):
    a, b = netns.add_host("a"), netns.add_host("b")
    pa, pb = PeerProc(netns, a, seed=1), PeerProc(netns, b, seed=2)
    assert pa.addr.startswith(f"/ip4/{a.ip}/tcp/")
    r = pb.request(pa.addr, {"n": 7})
    assert r["ok"], r
    assert r["reply"]["echo"] == {"n": 7} and r["reply"]["from"] == pb.peer
    assert r["reply"]["remote"][0] == b.ip  # came over the bridge from b's own address, not loopback
    # and back over the same connection: b answers a
    back = pa.request(pb.addr, {"n": 8})
    assert back["ok"] and back["reply"]["from"] == pa.peer, back


def test_nat_host_dials_out_but_cannot_be_dialled(netns):
    pub, nat = netns.add_host("pub"), netns.add_nat_host("nat")
    assert nat.behind_nat and nat.ip != nat.public_ip
    pp, pn = PeerProc(netns, pub, seed=1), PeerProc(netns, nat, seed=2)
    port = pn.addr.split("/")[4]
    # the public host cannot open a connection to it at the router's address with its port (nothing is
    # forwarded inward; one libp2p dial only: py-libp2p caches a failed peer for 60 s) ...
    denied = pp.request(f"/ip4/{nat.public_ip}/tcp/{port}/p2p/{pn.peer}", timeout=3.0)
    assert not denied["ok"], denied
    # ... and plain sockets agree, at that address and at its private one (no route to it)
    for ip in (nat.public_ip, nat.ip):
        probe = netns.run(pub, [sys.executable, "-c", (
            "import socket; s=socket.socket(); s.settimeout(2)\n"
            f"try: s.connect(('{ip}', {port})); print('connected')\n"
            "except OSError as e: print('fail', type(e).__name__)")], timeout=10)
        assert probe.stdout.startswith("fail"), (ip, probe)
    # the host behind NAT dials out, and is seen at its router's address (masquerade)
    out = pn.request(pp.addr, {"hi": 1})
    assert out["ok"], out
    assert out["reply"]["remote"][0] == nat.public_ip
    # over the connection it opened, the public host reaches it
    back = pp.request(pn.addr, {"hi": 2})
    assert back["ok"] and back["reply"]["from"] == pp.peer, back


def test_cut_link_stalls_requests_and_restore_resumes(netns):
    a, b = netns.add_host("a"), netns.add_host("b")
    pa, pb = PeerProc(netns, a, seed=1), PeerProc(netns, b, seed=2)
    assert pb.request(pa.addr)["ok"]
    netns.cut(a)
    cut = pb.request(pa.addr, timeout=2.0)
    assert not cut["ok"], cut
    netns.restore(a)
    for _ in range(10):  # bounded: the stalled connection resumes or a fresh dial succeeds
        again = pb.request(pa.addr, timeout=3.0)
        if again["ok"]:
            break
    assert again["ok"], again


def test_every_namespace_is_removed(netns):
    netns.add_host("a")
    netns.add_nat_host("s")
    p = netns.popen("a", ["sleep", "30"], stdout=subprocess.DEVNULL)
    made = netns.namespaces()
    assert len(made) == 4 and all(ns.startswith(PREFIX + netns.run_id) for ns in made)
    assert set(made) <= set(list_namespaces())
    netns.close()
    assert p.poll() is not None  # its process was stopped
    assert not [ns for ns in list_namespaces() if ns.startswith(netns.prefix)]


def test_leftovers_of_a_crashed_run_are_removed(netns):
    crash = subprocess.run([sys.executable, "-c", (
        "import os, subprocess, sys\n"
        "from tests.net.netns import Netns\n"
        "net = Netns('crash'); net.add_host('x')\n"
        "net.popen('x', ['sleep', '60'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,\n"
        "          start_new_session=True)\n"
        "print(net.prefix, flush=True); os._exit(0)  # no cleanup, like a SIGKILL\n")],
        capture_output=True, text=True, timeout=30, cwd=str(ROOT))
    prefix = crash.stdout.strip()
    assert prefix.startswith(PREFIX), crash
    left = [ns for ns in list_namespaces() if ns.startswith(prefix)]
    assert len(left) == 2  # its switch and its host survived it
    pids = subprocess.run(["ip", "netns", "pids", left[0] if left[0].endswith("-x") else left[1]],
                          capture_output=True, text=True, timeout=10).stdout.split()
    assert pids  # and so did its sleep
    cleanup_leftovers()  # what every new Netns does first (a parallel run's may get there first: same result)
    assert not [ns for ns in list_namespaces() if ns.startswith(prefix)]
    assert not [ns for ns in list_namespaces() if ns.startswith(netns.prefix) and ns not in netns.namespaces()]
    assert netns.switch in list_namespaces()  # a live run's namespaces are left alone
