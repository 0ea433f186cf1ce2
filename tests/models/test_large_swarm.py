"""Issue 36, check 2: a model larger than any one server. A synthetic Llama GGUF of 24 Q4_K blocks (6.0 GiB as
float32) is added once; four ``node start`` servers of six blocks each, every one in its own memory cgroup (v1)
capped at its span's float32 size + 1 GiB (2.5 GiB, below half the model) and started with that --max-memory,
serve it with committee duty on. Generation through them equals one process, every receipt is voted valid by
votes that are all valid (none abstained: the members re-execute other servers' spans block by block from disk),
and no server passes its cap or is killed.

Check 3 in the same swarm: a fifth server with an empty model cache is started with the model's id and the first
span (``node start --model ID --span 0:6 --bootstrap SERVER1``); it fetches those six blocks from server 1 in
checked chunks, registers them, and serves: with server 1 killed, generation is the same and routed through it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from node.compute.budget import block_bytes
from node.compute.reference import local_generate
from node.devnet import devnet_genesis
from node.ledger.core.status import FINAL
from node.models.convert import add_model
from node.models.lookup import model_dir_of

from .synth_gguf import write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]
CGROUP = Path("/sys/fs/cgroup/memory")
SHAPE = {"blocks": 24, "hidden": 2048, "ffn": 8192, "heads": 16, "kv_heads": 16, "vocab": 320}
GiB = 1 << 30
PROMPT = [5, 17, 42, 99, 3]


def _cgroups_or_skip() -> None:
    """Skip with the reason where memory cgroups cannot be made; CI runs as root, where they must work."""
    if os.environ.get("TALLY_REQUIRE_NETNS") == "1" or os.environ.get("CI"):
        assert (CGROUP / "cgroup.procs").exists() and os.access(CGROUP, os.W_OK), f"no writable {CGROUP} in CI"
    elif not ((CGROUP / "cgroup.procs").exists() and os.access(CGROUP, os.W_OK)):
        pytest.skip(f"needs a writable cgroup v1 memory controller at {CGROUP} (root)")


def _drop_cache(d: Path) -> None:
    """Write back and drop ``d``'s files from the page cache, so that what a capped server reads is charged to it."""
    for f in d.iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _spawn(tmp: Path, key: int, gfile: Path, cache: Path, model: str, *extra: str, cgroup: Path | None = None):
    d = tmp / f"n{key}"
    d.mkdir(parents=True, exist_ok=True)
    join = None if cgroup is None else (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())))
    return subprocess.Popen([sys.executable, "-m", "node.cli", "start", "--data-dir", str(d), "--model", model,
                             "--model-cache", str(cache), "--api-port", "0", "--genesis", str(gfile),
                             "--dev-account", str(key), "--log-level", "INFO", *extra],
                            stdout=open(d / "stdout.log", "ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                            preexec_fn=join)


def _info(tmp: Path, key: int, proc: subprocess.Popen, timeout: float = 300) -> dict:
    path, deadline = tmp / f"n{key}" / "node.json", time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"node {key} exited {proc.returncode}: " + \
            (tmp / f"n{key}" / "stdout.log").read_text(errors="replace")[-3000:]
        if path.exists() and json.loads(path.read_text()).get("pid") == proc.pid:
            return json.loads(path.read_text())
        time.sleep(0.3)
    raise AssertionError(f"node {key} not up in {timeout} s")


@pytest.mark.slow  # a 0.86 GiB GGUF, five node processes, committee re-execution from disk: minutes on 2 cores
def test_four_capped_servers_serve_a_model_twice_their_cap_and_every_vote_is_valid(tmp_path):
    _cgroups_or_skip()
    cache = tmp_path / "models"
    src = write_llama_gguf(tmp_path / "big.gguf", **SHAPE, type_name="Q4_K")
    model_dir = model_dir_of(add_model(src, cache, name="big").name, cache)
    src.unlink()
    block = block_bytes(model_dir)
    model_bytes = SHAPE["blocks"] * block
    span_bytes = 6 * block
    cap = span_bytes + GiB
    assert model_bytes >= 6 * GiB * 0.99 and cap < model_bytes / 2, (model_bytes / GiB, cap / GiB)
    gfile = tmp_path / "genesis.json"
    gfile.write_text(json.dumps(devnet_genesis(4)))
    _drop_cache(model_dir)
    groups: list[Path] = []
    procs: list[subprocess.Popen] = []
    try:
        client = _spawn(tmp_path, 0, gfile, cache, "big")
        procs.append(client)
        info0 = _info(tmp_path, 0, client)
        for k in range(1, 5):
            cg = CGROUP / f"tally-test-{os.getpid()}-{k}"
            cg.mkdir()
            groups.append(cg)
            (cg / "memory.limit_in_bytes").write_text(str(cap))
            procs.append(_spawn(tmp_path, k, gfile, cache, "big", "--span", f"{6 * (k - 1)}:{6 * k}",
                                "--max-memory", f"{cap / GiB:.4f}", "--bootstrap", info0["addrs"][0], cgroup=cg))
        infos = [info0] + [_info(tmp_path, k, procs[k]) for k in range(1, 5)]
        token = (tmp_path / "n0" / "api_token").read_text().strip()
        with httpx.Client(timeout=600, headers={"Authorization": f"Bearer {token}"}) as http:
            deadline = time.monotonic() + 120
            while len(http.get(f"{info0['api']}/v1/status").json()["swarm"]) < 4:
                assert time.monotonic() < deadline, "the four spans were not announced"
                time.sleep(0.5)
            r = http.post(f"{info0['api']}/v1/generate", json={"prompt_ids": PROMPT, "max_new_tokens": 6})
            assert r.status_code == 200, r.text
            gen = r.json()
            recs: dict[str, dict] = {}
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                recs = {x: http.get(f"{info0['api']}/v1/receipts/{x}").json() for x in gen["receipts"]}
                if all(v.get("status") in FINAL for v in recs.values()):
                    break
                time.sleep(1)
            memory = [http.get(f"{info['api']}/v1/status").json()["memory"] for info in infos[1:]]
            assert all(p.poll() is None for p in procs), "a node died"
            # check 3: a fifth server, own cgroup and an empty cache, fetches span 0:6 from server 1 and serves it
            cg5 = CGROUP / f"tally-test-{os.getpid()}-5"
            cg5.mkdir()
            groups.append(cg5)
            (cg5 / "memory.limit_in_bytes").write_text(str(cap))
            model_id = json.loads((model_dir / "manifest.json").read_text())["model_id"]
            procs.append(_spawn(tmp_path, 5, gfile, tmp_path / "models5", model_id, "--span", "0:6",
                                "--max-memory", f"{cap / GiB:.4f}", "--bootstrap", infos[1]["addrs"][0], cgroup=cg5))
            info5 = _info(tmp_path, 5, procs[5])
            fetched = sorted(p.name for p in (tmp_path / "models5").glob("*/block_*.safetensors"))
            assert fetched == [f"block_{i:03d}.safetensors" for i in range(6)], fetched
            procs[1].send_signal(signal.SIGKILL)
            procs[1].wait()
            deadline = time.monotonic() + 120
            while info5["peer_id"] not in {x["peer"] for x in http.get(f"{info0['api']}/v1/status").json()["swarm"]}:
                assert time.monotonic() < deadline, "the fifth server's span was not announced"
                time.sleep(0.5)
            r = http.post(f"{info0['api']}/v1/generate", json={"prompt_ids": PROMPT, "max_new_tokens": 6})
            assert r.status_code == 200, r.text
            gen5 = r.json()
        assert all(p.poll() is None for i, p in enumerate(procs) if i != 1), "a node died"
        usage = [int((cg / "memory.max_usage_in_bytes").read_text()) for cg in groups]
        failcnt = [int((cg / "memory.failcnt").read_text()) for cg in groups]
        print(f"\nmodel {model_bytes / GiB:.2f} GiB float32, cap {cap / GiB:.2f} GiB per server; peak usage (GiB) "
              f"{[round(u / GiB, 2) for u in usage]}, limit hits {failcnt}; committee "
              f"{[(m['streamed'], m['over_budget']) for m in memory]} (streamed, over budget)")
        # never at its cap: without --max-memory (members loading other spans whole) the same run hit the limit
        # 20,000+ times per server within a minute and stalled re-executing
        assert all(u <= cap for u in usage) and failcnt == [0] * 5
        assert [r["status"] for r in recs.values()] == ["valid"] * len(recs), {k[:8]: v for k, v in recs.items()}
        votes = [v for rec in recs.values() for v in rec["votes"]]
        assert votes and all(v["verdict"] == "valid" for v in votes), votes
        assert sum(m["streamed"] for m in memory) >= len(votes) and not any(m["over_budget"] for m in memory)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
        for cg in groups:
            cg.rmdir()
    want = local_generate(model_dir, PROMPT, 6)
    assert gen["tokens"] == want
    assert gen5["tokens"] == want and [h["span"] for h in gen5["route"] if h["peer"] == info5["peer_id"]] == [[0, 6]]
