"""Issue 23, check 4: a node started with --state-sync next to a crashing peer and lying peers syncs from the
honest one (real in-process nodes, real libp2p on 127.0.0.1, real LevelDB).

Beside the honest validator (which snapshots every 5 blocks), three hostile P2PHosts pass the genesis hello and
answer the snapshot protocol: one offers the honest manifest with the commit ``5`` (finding 3: it ended the
node), one a manifest of height 10^12 under a header signed by no validator (finding 4), one the honest offer
but drips each chunk 29 s late (just under the 30 s request timeout). The new node must come up from a snapshot
within a bounded time, ask neither the crashing nor the lying peer for a single chunk, ask the dripper once at
most, and then follow the chain with the validator's state roots."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import trio

from node.compute.model import make_tiny
from node.identity import Identity, dev_seed
from node.ledger import snapshot as snap, statesync as ss
from node.ledger.core.block import Header, sign_commit
from node.ledger.core.tx import Transfer
from node.net.service import NetworkService
from node.p2p.framing import read_msg, write_msg
from node.p2p.host import P2PHost
from node.runtime import Node

from .swarm import node_config, tiny_genesis

DRIP_S = 29.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


class Hostile:
    """A peer that passed the hello and answers ``/tally/snapshot/1.0.0`` with ``offer()`` and ``chunk(i)``
    (each a reply map, or None for an error). Records the ops it was asked."""

    def __init__(self, genesis, offer, chunk=None, delay: float = 0.0):
        self.host = P2PHost(Identity.generate(), 0, genesis.chain_id, genesis_hash=genesis.hash)
        self.net = NetworkService(self.host, genesis.hash)
        self.offer, self.chunk, self.delay = offer, chunk, delay
        self.ops: list[str] = []
        self.host.set_handler(ss.SNAPSHOT_PROTOCOL, self.handle)

    async def handle(self, stream, peer):
        msg = await read_msg(stream, timeout=10)
        self.ops.append(msg.get("op"))
        if msg.get("op") == "offer":
            await write_msg(stream, self.offer())
            return
        await trio.sleep(self.delay)
        reply = self.chunk(msg.get("index")) if self.chunk else None
        await write_msg(stream, reply or {"status": "error", "code": "not_found", "message": ""})

    async def run(self, task_status=trio.TASK_STATUS_IGNORED):
        async with self.host.running():
            await self.host.start_service(self.net.run)
            task_status.started()
            await trio.sleep_forever()


def test_state_sync_next_to_crashing_and_lying_peers(tmp_path, tiny):
    g = tiny_genesis(1)

    async def main():
        async with trio.open_nursery() as n:
            v = Node(replace(node_config(tmp_path, 0, g, tiny), snapshot_every=5))
            n.start_soon(v.run)
            await v.started.wait()
            me = v.ident.account
            to = Identity.from_seed(dev_seed(7)).account
            for _ in range(3):  # some state beyond genesis
                await v.ledger.submit(Transfer(g.domain, me, to, 10**6, v.ledger.next_nonce(me)).signed(v.ident))
            await v.ledger.wait_for_height(12, timeout=60)
            with trio.fail_after(30):
                while v.snapshots.manifest is None or v.store.head <= v.snapshots.manifest.height:
                    await v.ledger.new_block.wait()

            def honest():  # what the validator offers now (its snapshot moves on as blocks come)
                m, block = v.snapshots.offerable()
                return m, {"status": "ok", "manifest": m.to_wire(), "block": block}

            def crashing():
                offer = honest()[1]
                return {**offer, "block": {**offer["block"], "c": 5}}

            def lying():
                m, offer = honest()
                big = snap.Manifest(m.chain_id, 10**12, os.urandom(32), m.seq, m.counts, m.root, m.chunks)
                h = Header(*offer["block"]["b"]["h"])
                fake = Header(h.chain_id, 10**12 + 1, big.last_hash, h.time_ms, h.proposer, h.tx_root, h.state_root)
                forger = Identity.from_seed(dev_seed(9))  # not a validator
                return {**offer, "manifest": big.to_wire(),
                        "block": {"b": {"h": [fake.chain_id, *fake.fields()]},
                                  "c": [list(sign_commit(forger, fake.chain_id, fake.height, fake.hash))]}}

            def drip_chunk(i):
                m = honest()[0]
                return {"status": "ok", "data": v.snapshots.disk.chunk(m.chunks[i])}

            crash = Hostile(g, crashing, chunk=lambda i: {"status": "ok", "data": b"x"})
            liar = Hostile(g, lying, chunk=lambda i: {"status": "ok", "data": os.urandom(1 << 20)})
            dripper = Hostile(g, lambda: honest()[1], chunk=drip_chunk, delay=DRIP_S)
            for h in (crash, liar, dripper):
                await n.start(h.run)
            boot = [crash.host.addrs[0], liar.host.addrs[0], dripper.host.addrs[0], v.host.addrs[0]]
            s = Node(replace(node_config(tmp_path, 7, g, tiny), state_sync=True, bootstrap=boot))
            t0 = trio.current_time()
            n.start_soon(s.run)
            with trio.fail_after(DRIP_S * 3):  # one dripped chunk per chunk would take far longer
                await s.started.wait()
            took = trio.current_time() - t0
            base = s.store.base
            target = v.ledger.state.height + 3
            await s.ledger.wait_for_height(target, timeout=60)
            await v.ledger.wait_for_height(target, timeout=60)
            got, _ = s.store.get_block(target)
            want, _ = v.store.get_block(target)
            n.cancel_scope.cancel()
            return (base, took, got.header.state_root, want.header.state_root, crash.ops, liar.ops, dripper.ops,
                    list((tmp_path / "n7").glob("statesync-*")))

    base, took, got_root, want_root, crash_ops, liar_ops, drip_ops, spools = trio.run(main)
    assert base > 0 and base % 5 == 0  # started from a snapshot, not from genesis
    assert got_root == want_root  # and keeps the validator's state roots
    assert crash_ops == ["offer"] and liar_ops == ["offer"]  # refused before any chunk
    assert drip_ops.count("chunk") <= 1  # dropped after its first (grace) chunk request
    print(f"state sync next to hostile peers: node up in {took:.1f} s")
    assert spools == []  # the chunk spool under the data dir was removed
