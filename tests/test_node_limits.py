"""``node start --read-pool`` and ``--state-sync-max`` (issue 23: the read pool and the state-sync limits are an
operator's settings): parsed, carried into :class:`NodeConfig`, and applied by the node (the process's read pool
resized; a state sync's byte cap, with the chunk count and the offer size raised to match)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from node.cli import build_parser
from node.compute.model import make_tiny
from node.ledger.syncfetch import SyncLimits
from node.p2p.wirelimits import READ_BUDGET, READ_POOL
from node.runtime import Node
from tests.e2e.swarm import node_config, tiny_genesis

MIB = 1 << 20


def test_the_flags_parse_with_their_defaults():
    args = build_parser().parse_args(["start"])
    assert (args.read_pool, args.state_sync_max) == (256, 1024)
    args = build_parser().parse_args(["start", "--read-pool", "64", "--state-sync-max", "40960"])
    assert (args.read_pool, args.state_sync_max) == (64, 40960)
    for bad in (["--read-pool", "0"], ["--state-sync-max", "-1"], ["--read-pool", "lots"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["start", *bad])


def test_the_node_applies_them(tmp_path):
    tiny = make_tiny(tmp_path / "models", seed=0)
    cfg = replace(node_config(tmp_path, 0, tiny_genesis(1), tiny), read_pool_bytes=64 * MIB,
                  state_sync_max_bytes=40 * 1024 * MIB)
    try:
        node = Node(cfg)
        assert READ_BUDGET.capacity == 64 * MIB and READ_BUDGET.available == 64 * MIB
        lim = SyncLimits.capped(node.cfg.state_sync_max_bytes)  # what Node.run asks sync_or_replay for
        assert lim.max_bytes == 40 * 1024 * MIB
        assert lim.max_chunks == 40 * 1024 > SyncLimits().max_chunks  # 1 MiB chunks: the count follows the cap
        assert lim.max_offer_bytes > SyncLimits().max_offer_bytes
        node.store.close()
        small = Node(replace(cfg, data_dir=tmp_path / "n1", state_sync_max_bytes=16 * MIB, read_pool_bytes=None))
        assert READ_BUDGET.capacity == 64 * MIB  # not given: left as the process has it
        lim = SyncLimits.capped(small.cfg.state_sync_max_bytes)
        assert lim.max_bytes == 16 * MIB and lim.max_chunks == SyncLimits().max_chunks
        small.store.close()
        plain = Node(replace(cfg, data_dir=tmp_path / "n2", state_sync_max_bytes=None, read_pool_bytes=None))
        assert SyncLimits.capped(plain.cfg.state_sync_max_bytes) == SyncLimits()
        plain.store.close()
    finally:
        READ_BUDGET.configure(READ_POOL)
