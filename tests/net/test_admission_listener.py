"""Refusal in the listener's accept loop (:mod:`node.p2p.listener_guard`), against real P2PHosts on loopback.

Two nodes run in one process, each with its own admission limits: a connection churn against one is refused in
that node's accept loop (reset, no trio task spawned for it, no stream object), is counted by that node only, and
leaves both nodes serving fresh peers (issue 23, check 5).
"""

from __future__ import annotations

import socket
import time

import trio

from node.p2p.admission import AdmissionLimits
from node.p2p.listener_guard import ListenerGuard
from tests.net.test_admission import _port, fresh_peer, node, settled
from tests.p2p.util import run

ATTACKER = "127.0.0.7"
OTHER = "127.0.1.9"


class TaskCounter(trio.abc.Instrument):
    """Counts tasks trio spawns while installed."""

    def __init__(self) -> None:
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1


def churn(ip: str, port: int, n: int, within: float = 30.0) -> dict:
    """``n`` TCP connections from ``ip`` to 127.0.0.1:``port``, one after another, each closed by us after its
    first read (1 s at most): how many the node reset, closed with a FIN, admitted (it sent its multistream header)
    or left silent. Runs in a thread."""
    out = {"reset": 0, "fin": 0, "admitted": 0, "silent": 0, "failed": 0}
    deadline = time.monotonic() + within
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.bind((ip, 0))
            s.connect(("127.0.0.1", port))
            out["admitted" if s.recv(1 << 16) else "fin"] += 1
        except ConnectionResetError:
            out["reset"] += 1
        except TimeoutError:
            out["silent"] += 1
        except OSError:
            out["failed"] += 1
        finally:
            s.close()
    return out


def test_a_churn_over_the_accept_rate_is_reset_in_the_accept_loop_of_that_node_only():
    """600 connections one after another from one address, over its accept burst of 8 at 2/s: the rest are reset
    without a trio task each, and counted as refused by the flooded node only; the other node in the process (its
    own, default limits) sees nothing; both then serve fresh peers from the attacker's and another address.
    Shunning is off here (``shun_after=0``): this is the accept loop's own refusal (tests/net/test_shun.py shuns)."""
    limits = AdmissionLimits(accept_rate=2.0, accept_burst=8, pending_per_ip=8, shun_after=0)

    async def main():
        async with node(admission=limits) as (a, na), node() as (b, nb):
            guard_a = a.libp2p.get_network()._tally_listener_guard
            guard_b = b.libp2p.get_network()._tally_listener_guard
            assert isinstance(guard_a, ListenerGuard) and guard_a is not guard_b
            assert len(guard_a.guarded) >= 1 and len(guard_b.guarded) >= 1
            refused_b = dict(b.admission.refused)
            counter = TaskCounter()
            trio.lowlevel.add_instrument(counter)
            try:
                got = await trio.to_thread.run_sync(churn, ATTACKER, _port(a), 600)
            finally:
                trio.lowlevel.remove_instrument(counter)
            assert got["reset"] >= 500, got
            assert guard_a.refused_in_accept >= got["reset"], (guard_a.refused_in_accept, got)
            by_rate_or_pending = a.admission.refused["accept_rate_per_ip"] + a.admission.refused["pending_per_ip"]
            assert by_rate_or_pending >= got["reset"], a.admission.refused
            # the admitted few got a handler task each (plus their upgrade's tasks); the reset ones none
            print("churn", got, "tasks spawned", counter.spawned)
            assert counter.spawned < got["reset"] // 4, (counter.spawned, got)
            assert b.admission.refused == refused_b and guard_b.refused_in_accept == 0
            await settled(a)
            await trio.sleep(4.0)  # the attacker's bucket refills (2/s) so that its fresh peer may connect
            await fresh_peer(a, na, ATTACKER)
            await fresh_peer(a, na, OTHER)
            await fresh_peer(b, nb, ATTACKER)

    run(main, timeout=120)


def test_admitted_connections_through_the_guard_give_their_counts_back():
    """Connections admitted in the accept loop carry their ticket to the handler: counted pending then open while
    they live, all given back once they close (no count outlives its connection)."""

    async def main():
        async with node() as (a, na):
            assert len(a.libp2p.get_network()._tally_listener_guard.guarded) >= 1
            accepted = a.admission.accepted
            for i in range(3):
                await fresh_peer(a, na, f"127.0.1.{20 + i}")
            assert a.admission.accepted >= accepted + 3
            assert not a.libp2p.get_network()._tally_listener_guard._tickets  # every ticket reached its handler
            await settled(a)

    run(main, timeout=90)


def test_a_second_host_in_the_process_keeps_its_own_admission():
    """Each swarm's guard asks that swarm's admission: a host that reserves an address admits it past limits that
    refuse it at another host of the same process."""
    limits = AdmissionLimits(accept_rate=1.0, accept_burst=1, pending_per_ip=1)

    async def main():
        async with node(admission=limits) as (a, _), node(admission=limits) as (b, _):
            b.admission.reserve_ip(ATTACKER)
            got_a = await trio.to_thread.run_sync(churn, ATTACKER, _port(a), 40)
            got_b = await trio.to_thread.run_sync(churn, ATTACKER, _port(b), 10)
            assert got_a["reset"] >= 30, got_a
            assert got_b["reset"] == 0 and got_b["admitted"] == 10, got_b

    run(main, timeout=90)

