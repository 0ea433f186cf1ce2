"""`node genesis new|show` and `node key` as a user runs them, and the genesis document they write."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.encoding import BASE_UNITS
from node.genesis_cli import FlagError, parse_genesis_time
from node.identity import Identity, dev_seed
from node.ledger.genesis import Genesis, GenesisError, Params, load_genesis, parse_genesis

ROOT = Path(__file__).resolve().parents[1]
C = BASE_UNITS
DEV = [Identity.from_seed(dev_seed(i)).peer_id for i in range(4)]


def node(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def new(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return node("genesis", "new", "--chain-id", "tally-test-cli", "--out", str(out), *extra)


def test_new_then_show_then_parse_round_trip(tmp_path):
    out = tmp_path / "g.json"
    boot = f"/ip4/198.51.100.7/tcp/4001/p2p/{DEV[0]}"
    r = new(out, "--validator", f"{DEV[0]}=150", "--validator", DEV[1], "--account", f"{DEV[0]}=1000.5",
            "--account", f"{DEV[1]}=0:200", "--account", f"{DEV[2]}=0.000000001", "--params", "devnet",
            "--param", "block_time_ms=250", "--bootstrap", boot, "--genesis-time", "2030-01-02T03:04:05Z")
    assert r.returncode == 0, r.stderr
    g = load_genesis(out)  # exactly what `node start --genesis FILE` reads
    assert r.stdout.strip() == g.hash.hex()
    assert g.chain_id == "tally-test-cli" and g.bootstrap == (boot,)
    assert [Identity.from_seed(dev_seed(i)).account for i in (0, 1)] == list(g.validators)
    assert g.balances == ((Identity.from_seed(dev_seed(0)).account, 1000 * C + C // 2, 150 * C),
                          (Identity.from_seed(dev_seed(1)).account, 0, 200 * C),
                          (Identity.from_seed(dev_seed(2)).account, 1, 0))
    devnet = load_genesis().params
    assert g.params.block_time_ms == 250 and g.params.verdict_timeout == devnet.verdict_timeout
    assert g.genesis_time_ms == 1893553445000
    assert parse_genesis(json.loads(out.read_text())) == g
    shown = node("genesis", "show", str(out))
    assert shown.returncode == 0, shown.stderr
    for text in (g.hash.hex(), "tally-test-cli", "2030-01-02T03:04:05Z", boot, f"{DEV[0]}  bond 150 credits",
                 "total supply 1350.500000001 credits", "block_time_ms          250", "checks        ok"):
        assert text in shown.stdout, text
    js = json.loads(node("genesis", "show", "--json", str(out)).stdout)
    assert js["hash"] == g.hash.hex() and parse_genesis(js["genesis"]) == g


def test_to_doc_round_trips_and_bootstrap_is_not_in_the_hash():
    g0 = load_genesis()
    assert parse_genesis(json.loads(json.dumps(g0.to_doc()))) == g0
    a = Identity.from_seed(dev_seed(5)).account
    g = Genesis("tally-test-x", 1234, (a,), ((a, 7 * C + 3, 11 * C),), Params(slash_amount=10**12),
                (f"/dns4/boot.example.org/tcp/4001/p2p/{DEV[0]}",))
    back = parse_genesis(json.loads(json.dumps(g.to_doc())))
    assert back == g and back.hash == g.hash
    moved = Genesis(g.chain_id, g.genesis_time_ms, g.validators, g.balances, g.params, ())
    assert moved.hash == g.hash  # bootstrap lists may change; the chain stays the same
    assert Genesis(g.chain_id, 1235, g.validators, g.balances, g.params, g.bootstrap).hash != g.hash


def test_unsafe_params_are_refused_and_nothing_is_written(tmp_path):
    out = tmp_path / "g.json"
    r = new(out, "--validator", DEV[0], "--account", f"{DEV[0]}=10", "--param", "sample_floor_ppm=1000",
            "--param", "sample_base_ppm=1000")
    assert r.returncode != 0 and "cheating is profitable" in r.stderr and "nothing written" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no file, no temporary left behind
    assert new(out, "--validator", DEV[0], "--param", "committee_size=0").returncode != 0
    assert new(out, "--validator", DEV[0], "--param", "nonsense=3").returncode != 0
    assert new(out, "--validator", DEV[0], "--param", "min_bond=1.5").returncode != 0
    assert not out.exists()


@pytest.mark.parametrize("addr, says", [
    ("/ip4/198.51.100.7/tcp/4001", "/p2p/<peer ID>"),
    ("198.51.100.7:4001", "/p2p/<peer ID>"),
    (f"/ip4/0.0.0.0/tcp/4001/p2p/{DEV[0]}", "wildcard"),
    ("/ip4/198.51.100.7/tcp/4001/p2p/12D3KooWnotapeer", "/p2p/<peer ID>"),
    (f"/p2p/{DEV[0]}", "transport address"),
])
def test_bad_bootstrap_is_refused(tmp_path, addr, says):
    out = tmp_path / "g.json"
    r = new(out, "--validator", DEV[0], "--bootstrap", addr)
    assert r.returncode != 0 and says in r.stderr and not out.exists(), r.stderr
    doc = load_genesis().to_doc()
    doc["bootstrap"] = [addr]
    with pytest.raises(GenesisError):  # and a node refuses it in a file too
        parse_genesis(doc)


@pytest.mark.slow  # 36 s on 2 cores: in CI's slow step, so the default suite stays within its 15 min
def test_bad_flags_are_refused(tmp_path):
    out = tmp_path / "g.json"
    for extra, says in ((["--account", f"{DEV[0]}=1e3"], "not an amount"),
                        (["--account", f"{DEV[0]}=-1"], "not an amount"),
                        (["--account", f"{DEV[0]}=1.0000000001"], "more precise"),
                        (["--account", DEV[0]], "PEER_ID=BALANCE"),
                        (["--account", "nobody=5"], "not a peer ID"),
                        (["--account", f"{DEV[0]}=1", "--account", f"{DEV[0]}=2"], "given twice"),
                        (["--validator", DEV[0]], "given twice"),
                        (["--account", f"{DEV[0]}=1:2", "--validator", f"{DEV[0]}=3"], "given twice"),
                        (["--genesis-time", "tomorrow"], "ISO 8601"),
                        (["--params", str(tmp_path / "missing.json")], "No such file")):
        r = new(out, "--validator", DEV[0], *extra)
        assert r.returncode != 0 and says in r.stderr, (extra, r.stderr)
    r = node("genesis", "new", "--chain-id", "tally-devnet", "--out", str(out), "--validator", DEV[0])
    assert r.returncode != 0 and "embedded devnet" in r.stderr
    assert not out.exists()


def test_existing_file_is_not_overwritten_without_force(tmp_path):
    out = tmp_path / "g.json"
    out.write_text("keep me")
    r = new(out, "--validator", DEV[0])
    assert r.returncode != 0 and "not overwriting" in r.stderr and out.read_text() == "keep me"
    r = new(out, "--validator", DEV[0], "--force")
    assert r.returncode == 0 and load_genesis(out).hash.hex() == r.stdout.strip()


def test_default_genesis_time_is_now_rounded_down_to_the_second(tmp_path):
    before = int(time.time()) * 1000
    r = new(tmp_path / "g.json", "--validator", DEV[0])
    after = time.time() * 1000
    ms = load_genesis(tmp_path / "g.json").genesis_time_ms
    assert r.returncode == 0 and ms % 1000 == 0 and before <= ms <= after


def test_genesis_time_forms():
    assert parse_genesis_time("1767225600000") == 1767225600000
    assert parse_genesis_time("2026-01-01T00:00:00Z") == 1767225600000
    assert parse_genesis_time("2026-01-01T01:00:00+01:00") == 1767225600000
    assert parse_genesis_time("2026-01-01T00:00:00") == 1767225600000  # no offset: UTC
    for bad in ("", "soon", "-5", "1969-12-31T00:00:00Z"):
        with pytest.raises(FlagError):
            parse_genesis_time(bad)


def test_show_runs_the_start_checks(tmp_path):
    devnet = node("genesis", "show")
    assert devnet.returncode == 0 and "tally-devnet" in devnet.stdout
    assert load_genesis().hash.hex() in devnet.stdout and "checks        ok (p·S = 1 × " in devnet.stdout
    doc = load_genesis().to_doc()
    doc["params"].update(sample_floor_ppm=1000, sample_base_ppm=1000)  # p·S = 0.1 <= (1 − p)·G ≈ 50 credits
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = node("genesis", "show", str(bad))
    assert r.returncode != 0 and "check failed" in r.stderr and "cheating is profitable" in r.stderr
    r = node("genesis", "show", str(tmp_path / "absent.json"))
    assert r.returncode != 0 and "cannot read" in r.stderr


def test_key_prints_the_peer_id_and_creates_only_when_asked(tmp_path):
    d = tmp_path / "d"
    r = node("key", "--data-dir", str(d))
    assert r.returncode != 0 and "no node key" in r.stderr and "--create" in r.stderr
    assert not d.exists()  # nothing was created
    r = node("key", "--data-dir", str(d), "--create")
    assert r.returncode == 0 and "created" in r.stderr
    key = d / "node_key"
    assert key.stat().st_mode & 0o777 == 0o600
    peer = r.stdout.strip()
    assert peer == Identity.from_seed(key.read_bytes()).peer_id
    again = node("key", "--data-dir", str(d))
    assert again.returncode == 0 and again.stdout.strip() == peer and again.stderr == ""
    assert node("key", "--data-dir", str(d), "--create").stdout.strip() == peer  # never replaced
    key.chmod(0o644)
    r = node("key", "--data-dir", str(d))
    assert r.returncode != 0 and "0600" in r.stderr
