"""bench/training.py with its own settings and one seed runs end to end (real codec, outer step, assignment, screen,
SmolLM2 byte count), prints the report lines the issue names in a form that parses, and meets the three targets its
report prints: 4 workers below one worker, fraction of data-parallel's loss drop >= 0.95, bytes ratio <= 0.01."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from node.compute.model import SMOLLM2_NAME, default_cache_dir, find_gguf

ROOT = Path(__file__).resolve().parents[2]


def _smollm2_or_skip() -> None:
    """The bench counts bytes on SmolLM2-135M, found where the node finds models (``$TALLY_MODEL_CACHE``, else
    ``~/.cache/tally/models``) or converted there by the bench from the bundled GGUF; skip only when neither is
    possible."""
    if (default_cache_dir() / SMOLLM2_NAME / "manifest.json").is_file():
        return
    try:
        find_gguf()
    except RuntimeError as e:
        pytest.skip(f"SmolLM2-135M is neither converted in {default_cache_dir()} nor convertible here: {e}")


@pytest.mark.slow  # ~50 s on a quiet 2-core machine (one seed of the bench's own settings); CI's slow step runs it
def test_one_seed_meets_the_printed_targets(tmp_path):
    _smollm2_or_skip()
    out_json = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "training.py"), "--seeds", "1", "--json", str(out_json)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    ratio = [float(m.group(1)) for ln in lines if (m := re.fullmatch(r"bytes ratio to data-parallel: ([0-9.]+)", ln))]
    below = [m.group(1) for ln in lines if (m := re.fullmatch(r"4 workers below one worker: (true|false)", ln))]
    frac = [float(m.group(1)) for ln in lines
            if (m := re.match(r"fraction of data-parallel's loss drop: (-?[0-9.]+) ", ln))]
    verdict = [m.group(1) for ln in lines if (m := re.match(
        r"targets: 4 workers below one worker; fraction >= 0\.95; bytes ratio <= 0\.01 \(int8, H >= 25\) -- "
        r"(met|NOT all met); wall \d+ s$", ln))]
    assert len(ratio) == 1 and len(below) == 1 and len(frac) == 1 and len(verdict) == 1, r.stdout
    seeds = [ln for ln in lines if ln.startswith("seed ")]
    assert len(seeds) == 1
    assert "trained from scratch" in r.stdout and "too slow" in r.stdout

    res = json.loads(out_json.read_text())
    b = res["bytes"]
    # int8 payload of the SmolLM2 LoRA set: one int8 code per parameter plus one fp32 scale per tensor
    assert b["params"] == 460_800 and b["tensors"] == 120
    assert b["payload"] == b["params"] + 4 * b["tensors"] and b["grad"] == 4 * b["params"]
    H = res["args"]["inner_steps"]
    assert ratio[0] == pytest.approx(b["payload"] / (H * b["grad"]), rel=1e-3)
    # the printed verdict and fraction agree with the per-seed losses
    dl = [s["diloco"] for s in res["seeds"]]
    one = [s["single"] for s in res["seeds"]]
    assert below[0] == ("true" if sum(dl) < sum(one) else "false")
    fr = [(s["base"] - s["diloco"]) / (s["base"] - s["dp"]) for s in res["seeds"]]
    assert frac[0] == pytest.approx(sum(fr) / len(fr), abs=1e-4)
    for s in res["seeds"]:
        assert s["diloco"] < s["base"] and s["single"] < s["base"] and s["dp"] < s["base"]
        assert s["screened"] == res["args"]["rounds"] * res["args"]["workers"]

    # the three targets, each as the report prints it, then its own verdict line
    assert below[0] == "true", r.stdout  # 4 workers below one worker
    assert frac[0] >= 0.95, r.stdout  # fraction of data-parallel's loss drop
    assert ratio[0] <= 0.01, r.stdout  # bytes ratio to data-parallel (int8, H >= 25)
    assert verdict[0] == "met", r.stdout


@pytest.mark.slow  # ~90 s on a quiet 2-core machine: three SmolLM2-135M LoRA trainers, 2 rounds of 2 tiny steps
def test_the_real_model_run_prints_both_checks_consistently(tmp_path):
    """``--model smollm2`` (issue 40) with tiny settings: every figure of checks 1 and 2 is printed and agrees with
    the per-seed results (the targets themselves need the full run: see the bench's docstring)."""
    _smollm2_or_skip()
    out_json = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "training.py"), "--model", "smollm2", "--seeds", "1",
                        "--rounds", "2", "--inner-steps", "2", "--batch", "1", "--seq-len", "16", "--eval-windows",
                        "4", "--text", "hamlet", "--json", str(out_json)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    ratio = [float(m.group(1)) for ln in lines
             if (m := re.fullmatch(r"bytes ratio to data-parallel: ([0-9.]+) \(target <= 0\.002\)", ln))]
    wall = [float(m.group(1)) for ln in lines if (m := re.match(
        r"straggler \(worker 0 x3, quorum 3\): wall per round ratio ([0-9.]+) ", ln))]
    checks = [ln for ln in lines if re.fullmatch(r"check [12]: (met|NOT met)", ln)]
    assert len(ratio) == 1 and len(wall) == 1 and len(checks) == 2, r.stdout
    res = json.loads(out_json.read_text())
    (s,) = res["seeds"]
    assert s["payload"] == 36_540  # topk-int4 at 17,250 ppm on the 120 LoRA tensors (460,800 params)
    assert ratio[0] == pytest.approx(s["payload"] / (2 * s["grad"]), rel=1e-3)
    slow = sum(x["slow_blocks_q"] for x in s["rounds"]) / sum(x["blocks_q"] for x in s["rounds"])
    assert wall[0] == pytest.approx(slow, abs=1e-3)
    assert s["used"] == 2 * 4 and s["straggler_used"] == sum(len(x["slow_took"]) for x in s["rounds"])
    for x in s["rounds"]:  # the straggler's Δ is in a round exactly when the ledger's clock took it
        assert (0 in x["slow_took"]) == (x["slow_blocks_q"] >= -(-3 * x["times"][0] // 0.5))
    for k in ("dp", "single", "diloco", "straggler"):
        assert s[k] < s["base"]
