"""Issue 28's Jepsen-style test: four validators of a genesis made by ``node genesis new``, ``node start``
processes on network namespace hosts, a transfer workload from every validator's wallet API, and a fault schedule
drawn from a seed (every partition shape, a validator cut off and then killed with SIGKILL while its last transfers
are only in its outbox, restarted; one validator slow behind a delaying TCP relay throughout, healed network).
See :mod:`tests.net.jepsen` for the checks.

A span server (every block of the tiny model) and a client generating through it join the validators, each on one
side of every partition; at least :data:`~tests.net.jepsen.MIN_GENERATIONS` generations must succeed and their
receipts are held to the same check as the transfers. ``TALLY_JEPSEN_SWARM=0`` leaves them out (four validators
only). Measured on the shared 2-core machine this was written on: four validators 140-200 s (load 6-11, seeds
342151202 and 694402820); with the swarm 307 s (load 7-9; 21 generations, 577 transactions each in one block) and
383 s (load ~12; 19 generations, 736), seed 694402820, of which 75-136 s starting the six nodes. The swarm was off
by default at first: at load ~20 six node processes did not keep up (proposals 35 s late, refused for their block
time). At load 12-20 they now keep up, with recoveries of 15-42 s, but the 10 s whole-network latency bound failed
twice there (waits of 10.3-26.6 s for the run's last transfers).

The seed rotates per run (printed at the start and in every failure); replay one with ``TALLY_JEPSEN_SEED=<seed>``.
Skips with the reason where network namespaces are unavailable, unless ``TALLY_REQUIRE_NETNS=1``.
``TALLY_JEPSEN_KEEP=DIR`` copies the node logs of a failed run to ``DIR/seed-<seed>/``."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from node.compute.model import make_tiny

from .jepsen import Jepsen, JepsenFailure

# In CI's slow step (seeds rotate per run). It was quarantined for a stall at load 15-22 on 2 cores (seed 1006: all 4
# validators connected after a heal, no block for 60 s). The consensus states it now records showed why: every
# round timing out while proposals and votes took 5-9 s through event loops saturated by consensus gossip, most of
# it blind 1 s re-broadcasts (fixed in node.ledger.driver: re-sends only from a stuck round, backing off; one copy
# of each block; timeouts carried across heights in node.ledger.core.consensus).
pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_finality_and_every_accepted_transfer_under_partitions_kills_and_a_slow_validator(netns, tmp_path):
    seed = int(os.environ.get("TALLY_JEPSEN_SEED") or time.time_ns() % 1_000_000_007)
    print(f"\njepsen seed {seed} (replay: TALLY_JEPSEN_SEED={seed})", flush=True)
    cache = tmp_path / "models"
    make_tiny(cache, seed=0)
    j = Jepsen(netns, tmp_path, cache, seed, swarm=os.environ.get("TALLY_JEPSEN_SWARM", "1") != "0")
    try:
        j.setup()
        j.start()
        j.start_workload()
        j.run_schedule()
        summary = j.check_final(j.settle())
    except JepsenFailure as e:
        keep = os.environ.get("TALLY_JEPSEN_KEEP")  # a directory to copy the node logs to, for a post-mortem
        if keep:
            dest = Path(keep) / f"seed-{seed}"
            dest.mkdir(parents=True, exist_ok=True)
            for log in tmp_path.glob("*.log"):
                shutil.copy(log, dest / log.name)
        raise JepsenFailure(f"jepsen seed {seed} failed (replay: TALLY_JEPSEN_SEED={seed}):\n{e}") from None
    finally:
        j.close()
    print(summary, flush=True)
