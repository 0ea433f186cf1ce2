"""bench/swarm.py runs end to end at tiny swarm sizes (both designs, one measured child process per point, real hosts
on 127.0.0.1) and prints its side-by-side table, the ratio of the largest size to the smallest, check 1's six
lines, each what its numbers say, and per point a warm and a cold route lookup's bytes by protocol."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\s+(\d+) \|(.*)\|(.*)$", re.M)


@pytest.mark.slow  # six child processes (~25 s): a bench smoke test, like tests/training/test_bench_smoke.py
def test_bench_prints_both_designs_side_by_side(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "swarm.py"), "--servers", "4,12", "--seconds", "0.5",
                        "--settle", "0.5", "--mesh", "2", "--dht-servers", "4", "--lookups", "1",
                        "--log", str(tmp_path / "nodes.log")],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "gossip (today)" in out and "dht (light client)" in out
    rows = {int(m.group(1)): (m.group(2).split(), m.group(3).split()) for m in ROW.finditer(out)}
    assert set(rows) == {4, 12}, out
    for gossip, dht in rows.values():
        assert len(gossip) == 4 and len(dht) == 4, out  # CPU %, in kB/s, out kB/s, RSS MB each
        float(gossip[3].rstrip("*"))
        [float(x) for x in gossip[:3] + dht]
    assert float(rows[12][1][1]) > 0  # the light client's lookups read bytes
    assert re.search(r"gossip 12 / 4: CPU .*x|n/a", out) and "dht 12 / 4: CPU" in out
    assert "12 identities announcing, 2 msg/s offered" in out  # 12 servers / 5 s
    # a cold lookup finds its keys' closest peers anew (Kademlia's FIND_NODE), a warm one reuses them
    cold = re.findall(r"per cold lookup \(in \+ out\): (.*); [0-9.]+ connections opened, ([0-9.]+) Kademlia", out)
    warm = re.findall(r"per warm lookup \(in \+ out\): (.*) kB;", out)
    assert len(cold) == 2 and len(warm) == 2, out
    for parts, kad in cold:
        assert "/ipfs/kad/1.0.0" in parts and "/tally/discovery/1.0.0" in parts and float(kad) >= 1, out
    checks = [ln for ln in out.splitlines() if re.match(r"  (MET    |NOT MET) dht client", ln)]
    assert len(checks) == 6, out
    for ln in checks:  # each absolute target line is what its number says
        m = re.search(r"<= ([0-9.]+) \S+(?: of a core)? above idle: (-?[0-9.]+)$", ln)
        if m:
            assert ln.startswith("  MET ") == (float(m.group(2)) <= float(m.group(1))), ln
