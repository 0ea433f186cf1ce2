"""The README's "Run a network across machines", followed literally on four namespace hosts (C behind a NAT),
with the real SmolLM2 model: every command line of its blocks runs in its host, in a directory of its own."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest
from transformers import AutoTokenizer

from node.compute.model import ensure_smollm2
from node.compute.reference import local_generate

from .tally import ROOT, create_key

pytestmark = [pytest.mark.netns, pytest.mark.slow]

PROMPT = "The three most important inventions in human history are"


def readme_blocks() -> list[tuple[list[str], list[str]]]:
    """The section's ``sh`` blocks as (hosts, command lines), continuations joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Run a network across machines", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        lines = block.replace("\\\n", " ").splitlines()
        m = re.match(r"# on ((?:[ABCD](?:, | and )?)+)", lines[0])
        hosts = re.findall(r"[ABCD]", m.group(1)) if m else []
        out.append((hosts, [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]))
    return out


def test_the_readme_network_section_works_as_written(netns, tmp_path):
    blocks = readme_blocks()
    assert [h for h, _ in blocks] == [["A", "B", "C", "D"], ["A"], ["B"], ["C"], ["D"]]
    model_dir = ensure_smollm2()
    hosts = {"A": netns.add_host("a"), "B": netns.add_host("b"), "C": netns.add_nat_host("c"),
             "D": netns.add_host("d")}
    dirs = {}
    for name in hosts:
        d = dirs[name] = tmp_path / name
        d.mkdir()
        for entry in (".venv", "scripts"):  # each host's checkout; `bash scripts/setup` ran in the real one
            (d / entry).symlink_to(ROOT / entry)
    env = {"A": hosts["A"].ip, "PYTHONUNBUFFERED": "1"}
    procs: dict[str, subprocess.Popen] = {}

    def run(host: str, line: str, timeout: float = 120.0) -> str:
        if line.startswith("bash scripts/setup"):
            return ""  # already done for the checkout these hosts share
        if line.startswith(".venv/bin/node start "):  # a node runs until stopped: in the background
            log = open(dirs[host] / "node.log", "ab")  # noqa: SIM115 - the node's log, open for its life
            procs[host] = netns.popen(hosts[host], ["bash", "-c", line], env=env, cwd=dirs[host], stdout=log,
                                      stderr=subprocess.STDOUT)
            info = dirs[host] / "tally" / "node.json"
            deadline = time.monotonic() + 240
            while not info.exists():
                assert procs[host].poll() is None, (dirs[host] / "node.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"{host} did not start"
                time.sleep(0.5)
            return ""
        r = netns.run(hosts[host], ["bash", "-c", f"cd {dirs[host]} && {line}"], timeout=timeout, env=env)
        assert r.returncode == 0, f"{host}: {line}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    for line in blocks[0][1]:  # keys on every host; their peer IDs go to A's operator
        for name in hosts:
            out = run(name, line)
            if "node key" in line:
                env[f"{name}_ID"] = next(w for w in out.split() if w.startswith("12D3KooW"))
    assert env["A_ID"] == create_key(dirs["A"] / "tally")  # the key was made once and is read back
    for line in blocks[1][1]:
        run("A", line)
    for name in "BCD":  # "copy genesis.json to B, C and D"
        shutil.copy(dirs["A"] / "genesis.json", dirs[name] / "genesis.json")
    for name, i in (("B", 2), ("C", 3)):
        for line in blocks[i][1]:
            run(name, line)
    d_lines = blocks[4][1]
    run("D", d_lines[0])

    def d_api(path: str) -> dict:
        api = json.loads((dirs["D"] / "tally" / "node.json").read_text())["api"]
        r = netns.run(hosts["D"], ["curl", "-s", api + path], timeout=30)
        return json.loads(r.stdout)

    deadline = time.monotonic() + 180  # "once B and C are up"
    while d_api("/v1/swarm")["covered"] < 30:
        assert time.monotonic() < deadline, d_api("/v1/swarm")
        time.sleep(1)
    gen = json.loads(run("D", d_lines[1], timeout=300))
    assert "tokens" in gen, gen
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert gen["tokens"] == local_generate(model_dir, tok.encode(PROMPT), 32)
    assert [h["peer"] for h in gen["route"]] == [env["B_ID"], env["C_ID"]]
    balance = run("D", d_lines[2])
    assert "balance" in balance.lower()
    assert all(p.poll() is None for p in procs.values())  # everyone still up
