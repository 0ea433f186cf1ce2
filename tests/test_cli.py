"""The `node` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def node(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_gpu_without_cuda_fails_at_once_with_a_clear_message(tmp_path):
    t0 = time.monotonic()
    r = node("start", "--gpu", "0", "--data-dir", str(tmp_path), "--model", "tiny", "--model-cache", str(tmp_path))
    assert r.returncode != 0
    assert "--gpu 0: no CUDA device is available" in r.stderr
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "ledger").exists()  # nothing was started


def test_help_documents_the_test_switch_and_options():
    r = node("start", "--help")
    assert r.returncode == 0
    for word in ("--gpu", "--genesis", "--bootstrap", "--data-dir", "--span", "TEST SWITCH"):
        assert word in r.stdout
    d = node("devnet", "--help")
    assert "--once" in d.stdout and "--fault-server" in d.stdout


def test_bad_arguments_are_refused(tmp_path):
    assert "START < END" in node("start", "--span", "5:2").stderr
    for args, says in ((["--port", "99999"], "99999 is not a port"), (["--api-port", "-1"], "-1 is not a port"),
                       (["--threads", "0"], "0 is not >= 1"), (["--log-level", "loud"], "invalid choice"),
                       (["--bootstrap", "garbage"], "is not a multiaddr with a peer ID")):
        r = node("start", *args)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr)
    bad = tmp_path / "g.json"
    bad.write_text("{not json")
    r = node("start", "--genesis", str(bad), "--data-dir", str(tmp_path / "d"))
    assert r.returncode != 0 and "bad genesis" in r.stderr


def test_devnet_refuses_to_wipe_a_directory_it_did_not_make(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "IMPORTANT.txt").write_text("keep me")
    r = node("devnet", "--once", "--model", "tiny", "--model-cache", str(tmp_path / "m"), "--data-dir", str(precious))
    assert r.returncode == 2 and "refusing to wipe" in r.stderr
    assert (precious / "IMPORTANT.txt").read_text() == "keep me"
    assert node("devnet", "--servers", "0").returncode == 2
    r = node("devnet", "--once", "--tokens", "0", "--data-dir", str(tmp_path / "dv"))
    assert r.returncode == 2 and "--tokens must be at least 1" in r.stderr
    r = node("devnet", "--once", "--job", "hamlet", "--job-steps", "0", "--data-dir", str(tmp_path / "dv"))
    assert r.returncode == 2 and "--job-steps must be at least 1" in r.stderr
    assert not (tmp_path / "dv").exists()  # refused before anything started


def test_busy_api_port_is_refused_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = node("start", "--api-port", str(port), "--data-dir", str(tmp_path / "d"), "--model", "tiny",
                 "--model-cache", str(tmp_path / "m"))
    assert r.returncode != 0 and f"--api-port: cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "m").exists()  # refused before the model was made


def test_a_second_node_on_the_same_data_dir_is_refused_at_once(tmp_path):
    from node.lockfile import hold

    held = hold(tmp_path / "d" / "node.lock")  # as a running (or still booting) node holds it
    try:
        r = node("start", "--data-dir", str(tmp_path / "d"), "--model", "tiny", "--model-cache", str(tmp_path / "m"))
    finally:
        held.close()
    assert r.returncode != 0 and f"another node (pid {os.getpid()}) is running in {tmp_path / 'd'}" in r.stderr
    assert not (tmp_path / "m").exists()


def test_data_dir_works_before_and_after_the_subcommand():
    """Issue 38: common options work where people type them -- ``node wallet balance --data-dir D`` was refused
    ("unrecognized arguments"); every command group that takes ``--data-dir`` takes it after its subcommands too,
    and the group's default stands when it is given nowhere."""
    from node.cli import DEFAULT_DATA_DIR, build_parser

    p = build_parser()
    for group, sub in (("wallet", ["balance"]), ("wallet", ["tabs"]), ("batch", ["status", "ab" * 32]),
                       ("job", ["list"]), ("run", ["list"])):
        after = p.parse_args([group, *sub, "--data-dir", "/after"])
        before = p.parse_args([group, "--data-dir", "/before", *sub])
        default = p.parse_args([group, *sub])
        assert (str(after.data_dir), str(before.data_dir), default.data_dir) == ("/after", "/before",
                                                                                  DEFAULT_DATA_DIR), group
