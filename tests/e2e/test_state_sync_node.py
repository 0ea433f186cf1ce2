"""A node started with --state-sync on an empty ledger installs the validator's snapshot (real libp2p on
127.0.0.1, real LevelDB) instead of replaying the chain, then follows the chain with the same state roots."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio

from node.compute.model import make_tiny
from node.identity import Identity, dev_seed
from node.ledger.core.tx import Transfer
from node.runtime import Node

from .swarm import node_config, tiny_genesis


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_a_new_node_state_syncs_and_follows(tmp_path, tiny):
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
            cfg = replace(node_config(tmp_path, 7, g, tiny), state_sync=True, bootstrap=v.host.addrs)
            s = Node(cfg)
            n.start_soon(s.run)
            await s.started.wait()
            base = s.store.base
            target = v.ledger.state.height + 3
            await s.ledger.wait_for_height(target, timeout=60)
            await v.ledger.wait_for_height(target, timeout=60)
            got, _ = s.store.get_block(target)
            want, _ = v.store.get_block(target)
            n.cancel_scope.cancel()
            return base, got.header.state_root, want.header.state_root, v.snapshots.manifest.height

    base, got_root, want_root, snap_height = trio.run(main)
    assert base > 0 and base % 5 == 0 and base <= snap_height  # started from a snapshot, not from genesis
    assert got_root == want_root  # and keeps the validator's state roots
