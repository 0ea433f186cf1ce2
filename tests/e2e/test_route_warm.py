"""A client node keeps its route's servers connected before it generates (issue 25: the first token in seconds).

Real nodes on 127.0.0.1 (libp2p, LevelDB, the tiny Llama): a validator, two span servers bootstrapped to it, and
two client nodes bootstrapped to it alone. On loopback a node keeps no connections beyond its bootstrap peers
(``NetworkService._target``; py-libp2p's own auto-connector, which dials every known peer about every 10 s, is
switched off here), so only :meth:`RouteClient.keep_route_connected` connects a client to the servers: the client
with it (the default for a node that serves no span) is connected to both before any generation, the client
without it (``warm_route=False``) to neither, and the first generation of the warmed client goes through the
connections that were already there.

The first token's time is bounded against measurements of the same run, never against a clock: of the warmed
client's first token, at most 1 % went to :meth:`RouteClient._dial` (timed around it; measured 15-20 us of 0.1 s,
and 0.16-0.27 s of 0.6-1.6 s with the warm-up off), and the control's first token holds its dial, more than ten
times as long (0.03-0.3 s). A whole first token against the control's is no bound here: at load 9-12 on 2 cores the
dial is ~0.1 s of a first token of 1-1.5 s (the first streams and the first step of a client's first generation are
most of it), and the control came first in 1 of 3 runs. The clients hold no bond and receipts are sampled at 0.1 %
(no committee re-executes one during the timing), the chain is quiet between generations (``heartbeat_ms``), and the
servers' first sessions go to the validator's generation, before either client is timed.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import trio

from node.compute.model import make_tiny
from node.identity import Identity, dev_seed
from node.runtime import Node

from .swarm import C, node_config, tiny_genesis

WARM, COLD = 3, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


async def _no_auto_connect(self) -> None:
    return None


class Dials:
    """Seconds a node's route client spends in ``_dial`` (connecting a hop's server) while :attr:`on`."""

    def __init__(self, node: Node):
        self.on, self.spent = False, 0.0
        self.inner = node.client._dial
        node.client._dial = self._timed

    async def _timed(self, peer: str) -> None:
        t0 = time.perf_counter()
        try:
            await self.inner(peer)
        finally:
            if self.on:
                self.spent += time.perf_counter() - t0

    async def generate(self, node: Node):
        self.on = True
        try:
            return await node.generate([3, 4, 5], 2)
        finally:
            self.on = False


def test_a_client_connects_to_its_route_before_generating(tmp_path, tiny, monkeypatch):
    # py-libp2p's auto-connector dials every peer in the peerstore about every 10 s whatever the node's policy (seen
    # here: by the time the control generated, every node was connected to every other); off, so that only the
    # warm-up connects a client to its route and the control still has to dial
    from libp2p.network.auto_connector import AutoConnector  # local: py-libp2p takes ~1.3 s to import

    monkeypatch.setattr(AutoConnector, "maybe_connect", _no_auto_connect)
    # validator 0, servers 1 and 2 (bonded, each the other's committee); the clients funded, never on a committee
    g = tiny_genesis(2, committee_size=1, heartbeat_ms=30_000, sample_base_ppm=1000, sample_floor_ppm=1000,
                     max_receipt_price=10**8)
    g = replace(g, balances=g.balances + tuple((Identity.from_seed(dev_seed(k)).account, 100 * C, 0)
                                                for k in (WARM, COLD)))

    async def main():
        async with trio.open_nursery() as n:
            v = Node(node_config(tmp_path, 0, g, tiny))
            n.start_soon(v.run)
            await v.started.wait()
            servers = [Node(replace(node_config(tmp_path, i, g, tiny, span=span), bootstrap=v.host.addrs))
                       for i, span in ((1, (0, 3)), (2, (3, 6)))]
            warm = Node(replace(node_config(tmp_path, WARM, g, tiny), bootstrap=v.host.addrs))
            cold = Node(replace(node_config(tmp_path, COLD, g, tiny), bootstrap=v.host.addrs, warm_route=False))
            for nd in (*servers, warm, cold):
                n.start_soon(nd.run)
            for nd in (*servers, warm, cold):
                await nd.started.wait()
            want = {s.ident.peer_id for s in servers}
            with trio.fail_after(30):  # both spans announced to both clients
                while not all(len(c.swarm.live(c.manifest.model_id)) == 2 for c in (warm, cold)):
                    await trio.sleep(0.1)
            with trio.fail_after(30):  # the warmed client dials its route without being asked to generate
                while not want <= set(warm.host.connected_peers()):
                    await trio.sleep(0.1)
            assert {p for p, _s, _e in warm.client.route()} == want
            # the same time again: the client without the warmer still has its bootstrap connection only
            await trio.sleep(3.0)
            assert not want & set(cold.host.connected_peers()), cold.host.connected_peers()

            async def landed(gen):  # its receipts are in a block: the ledger's work on them is not timed after it
                with trio.fail_after(60):
                    while any(v.ledger.state.receipts.get(r.id) is None for r in gen.receipts):
                        await v.ledger.new_block.wait()

            await landed(await v.generate([3, 4, 5], 2))  # the servers' first sessions, timed by nobody
            dw, dc = Dials(warm), Dials(cold)
            assert want <= set(warm.host.connected_peers())
            gen = await dw.generate(warm)
            assert len(gen.tokens) == 2 and {p for p, _s, _e in gen.route} == want
            await landed(gen)
            # the control: the same first generation from the client that has to dial both servers first
            assert not want & set(cold.host.connected_peers()), cold.host.connected_peers()
            ctl = await dc.generate(cold)
            assert ctl.tokens == gen.tokens and {p for p, _s, _e in ctl.route} == want
            assert gen.first_token_s is not None and ctl.first_token_s is not None
            times = {"warmed": (dw.spent, gen.first_token_s), "control": (dc.spent, ctl.first_token_s)}
            # (seconds dialing, first token): the warmed client's first token waited for no dial; the control's did
            assert dw.spent <= 0.01 * gen.first_token_s, times
            assert 10 * dw.spent < dc.spent <= ctl.first_token_s, times
            n.cancel_scope.cancel()

    trio.run(main)
