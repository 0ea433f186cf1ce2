"""`node job post/list/status/fetch/cancel` against a live in-process swarm, as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from node.compute.model import make_tiny

from ..e2e.swarm import swarm

ROOT = Path(__file__).resolve().parents[2]
SPANS = [(0, 2), (2, 4), (4, 6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def job_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "job", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)


@pytest.mark.slow  # 30 s on 2 cores: in CI's slow step, so the default suite stays within its 15 min
def test_job_cli_round_trip(tmp_path, tiny):
    text = tmp_path / "data.txt"
    text.write_text((ROOT / "docs" / "DESIGN.md").read_text() * 2)

    async def main():
        async with swarm(tmp_path, tiny, SPANS, accept_jobs={1}) as nodes:
            d0 = nodes[0].cfg.data_dir

            async def run(*args):
                return await trio.to_thread.run_sync(lambda: job_cli(d0, *args))

            post = await run("post", "--text", str(text), "--title", "cli job", "--steps", "4", "--segment-steps",
                             "2", "--batch-size", "2", "--seq-len", "16", "--lr", "0.01", "--price-per-step", "0.5",
                             "--follow")
            job_id = post.stdout.split()[2]
            listed = await run("list")
            fetched = await run("fetch", job_id, "--out", str(tmp_path / "adapter"))
            cancel = await run("cancel", job_id)
            bad = await run("status", "0" * 32)
            return post, listed, fetched, cancel, bad, job_id

    post, listed, fetched, cancel, bad, job_id = trio.run(main)
    assert post.returncode == 0, post.stderr
    assert '"status": "settled"' in post.stdout and "4/4" in post.stderr  # the tqdm bar reached the end
    assert job_id in listed.stdout and "settled" in listed.stdout and "'cli job'" in listed.stdout
    assert fetched.returncode == 0 and "held-out loss" in fetched.stdout
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert cancel.returncode != 0 and "only an open job" in cancel.stderr
    assert bad.returncode != 0 and "not_found" in bad.stderr
