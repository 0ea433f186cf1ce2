"""A node that loads no model imports neither torch nor transformers (issue 35, "Nodes start fast"): torch alone took
1.5-3.4 s of ``node start`` before its first block. ``bench/startup.py`` measures the seconds; this checks, in fresh
interpreters, what gets imported: ``import node.runtime`` and ``import node.cli``, and a whole ``node start`` of a
lone devnet validator with ``--lazy-head`` and no ``--span`` (the tiny model named, none of its weights loaded) up to
its first block. No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.compute.model import make_tiny

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "safetensors")

# `node start` in this interpreter (node.cli.main, as the `node` script runs it); a thread watches the node's API
# until its first block, prints which of HEAVY are in sys.modules, then stops the node as Ctrl-C would
START = """
import json, os, signal, sys, threading, time
from pathlib import Path

import httpx

from node import cli

HEAVY, data, cache = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]


def watch():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            api = json.loads((data / "node.json").read_text())["api"]
            if httpx.get(api + "/v1/status", timeout=5).json()["height"] >= 1:
                print(json.dumps([m for m in HEAVY if m in sys.modules]), flush=True)
                break
        except (OSError, ValueError, KeyError, httpx.HTTPError):  # not written yet, or not answering yet
            pass
        time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGINT)


threading.Thread(target=watch, daemon=True).start()
sys.exit(cli.main(["start", "--data-dir", str(data), "--model", "tiny", "--model-cache", cache, "--dev-account",
                   "0", "--api-port", "0", "--lazy-head", "--log-level", "warning"]))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def _loaded(code: str, *args: str, timeout: float = 60) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code, json.dumps(HEAVY), *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines, f"no report from the child:\n{out.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("module", ["node.runtime", "node.cli"])
def test_importing_the_node_imports_no_torch(module):
    code = f"import json, sys, {module}; print(json.dumps([m for m in json.loads(sys.argv[1]) if m in sys.modules]))"
    assert _loaded(code) == []


def test_a_validator_without_a_model_runs_to_its_first_block_without_torch(tiny, tmp_path):
    assert _loaded(START, str(tmp_path / "data"), str(tiny.parent), timeout=180) == []


def test_the_check_sees_torch_when_a_node_loads_a_model():
    """The same report, in a child that does import torch: the check above can fail."""
    code = "import json, sys, torch; print(json.dumps([m for m in json.loads(sys.argv[1]) if m in sys.modules]))"
    assert "torch" in _loaded(code)
