"""Issue 12, check 6: honest round receipts produced at torch thread count 1 and replayed at 2 (separate
processes) are never voted invalid: 200 receipts on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.training.rounds import ROUND_TOLERANCE

ROOT = Path(__file__).resolve().parents[2]


def _run(mode: str, threads: int, out: Path, beacons: int) -> dict:
    p = subprocess.run([sys.executable, "-m", "tests.training.replay_proc", mode, str(threads), str(out),
                        str(beacons)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two processes, 200 rounds trained and 400 replayed: about a minute on 2 cores
def test_200_honest_replays_across_thread_counts_are_all_valid(tmp_path):
    _run("produce", 1, tmp_path, 50)  # 50 beacons × 4 workers = 200 round receipts at 1 thread
    across = _run("replay", 2, tmp_path, 50)
    same = _run("replay", 1, tmp_path, 50)
    assert across["n"] == 200 and across["invalid"] == 0, across
    assert across["max_distance"] <= ROUND_TOLERANCE / 10, across  # honest noise well inside the tolerance
    assert same["invalid"] == 0 and same["max_distance"] == 0.0, same  # equal thread counts: bit for bit
    print(f"\nmax distance across thread counts: {across['max_distance']:.3g} (tolerance {ROUND_TOLERANCE})")
