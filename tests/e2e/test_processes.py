"""Node processes as a user runs them: `node start` killed with SIGKILL and restarted, and `node devnet`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from node.compute.model import make_tiny

ROOT = Path(__file__).resolve().parents[2]


def start(data_dir: Path, cache: Path, *extra: str) -> subprocess.Popen:
    (data_dir / "node.json").unlink(missing_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "node.cli", "start", "--data-dir", str(data_dir), "--model",
                             "tiny", "--model-cache", str(cache), "--api-port", "0", *extra],
                            stdout=open(data_dir / "stdout.log", "ab"), stderr=subprocess.STDOUT, cwd=ROOT)


def info(data_dir: Path, proc: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, (data_dir / "stdout.log").read_text()[-2000:]
        if (data_dir / "node.json").exists():
            return json.loads((data_dir / "node.json").read_text())
        time.sleep(0.2)
    raise TimeoutError(f"{data_dir} did not start")


def stop_all(procs: list) -> None:
    """SIGTERM every process still running, then SIGKILL any that has not exited within 15 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def status(api: str) -> dict:
    return httpx.get(f"{api}/v1/status", timeout=10).json()


def wait_height(api: str, h: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = status(api)["height"]
        if got >= h:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"{api} did not reach height {h}")


@pytest.mark.slow  # 27 s on 2 cores: in CI's slow step, so the default suite stays within its 15 min
def test_killed_node_reopens_its_stored_state_and_rejoins(tmp_path):
    cache = tmp_path / "models"
    make_tiny(cache, 0)
    d0, d1 = tmp_path / "n0", tmp_path / "n1"
    procs = []
    try:
        procs.append(start(d0, cache, "--dev-account", "0"))
        i0 = info(d0, procs[0])
        procs.append(start(d1, cache, "--dev-account", "1", "--span", "0:6", "--bootstrap", i0["addrs"][0]))
        i1 = info(d1, procs[1])
        wait_height(i1["api"], 4)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        h0 = wait_height(i0["api"], status(i0["api"])["height"] + 4)
        procs[1] = start(d1, cache, "--span", "0:6", "--bootstrap", i0["addrs"][0])
        i1b = info(d1, procs[1])
        assert i1b["peer_id"] == i1["peer_id"]  # same key from the data dir
        wait_height(i1b["api"], h0 + 1)
        b0 = httpx.get(f"{i0['api']}/v1/blocks/{h0}", timeout=10).json()
        b1 = httpx.get(f"{i1b['api']}/v1/blocks/{h0}", timeout=10).json()
        assert b0["hash"] == b1["hash"]
        log = (d1 / "node.log").read_text()
        opened = re.findall(r"ledger opened: head (\d+)", log)  # the stored state, no block replayed
        assert len(opened) == 2 and int(opened[0]) == 0 and int(opened[1]) >= 4, opened
    finally:
        stop_all(procs)


def devnet(tmp_path: Path, *extra: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "node.cli", "devnet", "--once", "--api-port", "0",
                           "--data-dir", str(tmp_path / "devnet"), *extra], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.slow  # 38 s on 2 cores: in CI's slow step, so the default suite stays within its 15 min
def test_devnet_fault_switch_gets_slashed(tmp_path):
    cache = tmp_path / "models"
    r = devnet(tmp_path, "--model", "tiny", "--model-cache", str(cache), "--tokens", "6", "--fault-server", "2",
               timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("verdict: valid") == 2 and r.stdout.count("verdict: invalid") == 1
    assert "slashed 100 credits" in r.stdout
    assert "committee fees" in r.stdout and ": true" in r.stdout


@pytest.mark.slow  # 38 s on 2 cores: in CI's slow step, so the default suite stays within its 15 min
def test_devnet_job_demo_settles_and_pays_exactly(tmp_path):
    """The README's `node devnet --job PLAY` path: the post is followed from submission (404 until its block) to
    settlement, the adapter is fetched and the requester pays exactly the price."""
    r = devnet(tmp_path, "--model", "tiny", "--model-cache", str(tmp_path / "models"), "--no-inference",
               "--job", "hamlet", "--job-steps", "2", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "settled" in r.stdout and "verdict valid" in r.stdout
    assert "requester paid 0.02 (price 0.02): true" in r.stdout and "committee fees 0.002: true" in r.stdout


@pytest.mark.slow  # six node processes; ~40 s on 2 cores
def test_devnet_with_five_servers_pays_through_tabs_and_every_receipt_is_valid(tmp_path):
    """Issue 36: ``node devnet --servers N`` beyond the embedded genesis' three bonded keys. Issue 37 on the same
    run (the devnet settles through tabs by default): each server's receipt comes back revealed from its epoch
    batch with its committee's votes, each tab redeemed what its receipt says is owed, and the balances add up."""
    r = devnet(tmp_path, "--model", "tiny", "--model-cache", str(tmp_path / "models"), "--servers", "5",
               "--tokens", "4", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "chain tally-test-devnet, dev keys 1-5 bonded" in r.stdout
    assert sum(f"node{i} " in r.stdout for i in range(6)) == 6 and "serves blocks" in r.stdout
    assert r.stdout.count("verdict: valid") == 5 and "verdict: invalid" not in r.stdout
    assert "tabs and epochs of 10 blocks" in r.stdout and r.stdout.count("  pays node") == 5
    assert "what the servers earned together (committee fees between them): true" in r.stdout
    assert "identical: true" in r.stdout


def test_devnet_genesis_bonds_every_server_and_keeps_the_embedded_params():
    from node.devnet import WIDE_CHAIN, devnet_genesis
    from node.identity import Identity, dev_seed
    from node.ledger.core.genesis import parse_genesis
    from node.ledger.genesis import load_genesis

    g, embedded = parse_genesis(devnet_genesis(7)), load_genesis()
    assert g.chain_id == WIDE_CHAIN and g.params == embedded.params and g.validators == embedded.validators
    bonded = {a for a, _bal, bond in g.balances if bond > 0}
    assert bonded == {Identity.from_seed(dev_seed(i)).account for i in range(1, 8)}
    assert len(g.balances) == 1 + 7 + 4  # the validator, seven servers, four spares


def test_devnet_refuses_more_servers_than_blocks(tmp_path):
    r = devnet(tmp_path, "--model", "tiny", "--model-cache", str(tmp_path / "models"), "--servers", "7", timeout=120)
    assert r.returncode == 2 and "the model has only 6 blocks" in r.stderr


def test_a_second_devnet_on_a_running_devnets_dir_refuses_and_wipes_nothing(tmp_path):
    import fcntl

    root = tmp_path / "devnet"
    root.mkdir()
    (root / ".tally-devnet").write_text("")
    (root / "node0").mkdir()
    (root / "node0" / "ledger-data").write_text("precious")
    with open(tmp_path / "devnet.lock", "a+") as held:  # as the running devnet holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        r = devnet(tmp_path, "--model", "tiny", "--model-cache", str(tmp_path / "models"), timeout=120)
    assert r.returncode == 2 and "another `node devnet` (pid 4242) is running" in r.stderr, r.stderr
    assert (root / "node0" / "ledger-data").read_text() == "precious"
    # a node running in the devnet's dir — even one still booting, before its node.json exists — holds
    # node.lock from its first moment: devnet refuses to wipe it
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                                "from node.lockfile import hold\nf = hold(Path(sys.argv[1]))\n"
                                "print('held', flush=True)\ntime.sleep(60)", str(root / "node0" / "node.lock")],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline().strip() == "held"
        r = devnet(tmp_path, "--model", "tiny", "--model-cache", str(tmp_path / "models"), timeout=120)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 2 and f"nodes are still running in {root / 'node0'} (pid {sleeper.pid})" in r.stderr, \
        r.stderr
    assert (root / "node0" / "ledger-data").read_text() == "precious"


@pytest.mark.slow
def test_devnet_real_model_identical(tmp_path):
    r = devnet(tmp_path, "--tokens", "32", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "identical: true" in r.stdout
    assert r.stdout.count("verdict: valid") == 3


@pytest.mark.slow  # about a minute on 2 cores (four validator processes); CI's slow step runs it
def test_four_validator_processes_survive_a_kill_and_the_restart_rejoins(tmp_path):
    from node.identity import Identity, dev_seed

    cache = tmp_path / "models"
    make_tiny(cache, 0)
    ids = [Identity.from_seed(dev_seed(i)).peer_id for i in range(4)]
    genesis = tmp_path / "genesis.json"
    genesis.write_text(json.dumps({
        "chain_id": "tally-test-4v", "validators": ids,
        "accounts": [{"account": a, "balance": "100", "bond": "200"} for a in ids],  # credits
        "params": {"block_time_ms": 300}}))
    dirs = [tmp_path / f"v{i}" for i in range(4)]
    procs: list = []
    try:
        procs.append(start(dirs[0], cache, "--genesis", str(genesis), "--dev-account", "0"))
        infos = [info(dirs[0], procs[0])]
        boot = infos[0]["addrs"][0]
        for i in (1, 2, 3):
            procs.append(start(dirs[i], cache, "--genesis", str(genesis), "--dev-account", str(i), "--bootstrap", boot))
        infos += [info(dirs[i], procs[i]) for i in (1, 2, 3)]
        apis = [x["api"] for x in infos]
        wait_height(apis[3], 5)
        procs[3].send_signal(signal.SIGKILL)
        procs[3].wait()
        h_kill = status(apis[0])["height"]
        for api in apis[:3]:
            wait_height(api, h_kill + 4)  # three of four keep finalizing
        procs[3] = start(dirs[3], cache, "--genesis", str(genesis), "--bootstrap", boot)
        infos[3] = info(dirs[3], procs[3])
        apis[3] = infos[3]["api"]
        top = wait_height(apis[0], status(apis[0])["height"] + 4)
        wait_height(apis[3], top)  # the restarted validator synced
        signers_after = set()
        for h in range(1, top + 1):
            hashes = {httpx.get(f"{api}/v1/blocks/{h}", timeout=10).json()["hash"] for api in apis}
            assert len(hashes) == 1, f"fork at height {h}"
        for h in range(top - 2, top + 1):  # it rejoined: it precommits again
            blk = httpx.get(f"{apis[0]}/v1/blocks/{h}", timeout=10).json()
            signers_after |= {c["validator"] for c in blk["commit"]}
        deadline = time.monotonic() + 30
        while ids[3] not in signers_after and time.monotonic() < deadline:
            top = wait_height(apis[0], top + 1)
            blk = httpx.get(f"{apis[0]}/v1/blocks/{top}", timeout=10).json()
            signers_after |= {c["validator"] for c in blk["commit"]}
        assert ids[3] in signers_after
    finally:
        stop_all(procs)


@pytest.mark.slow  # 23-30 s on 2 cores (three node starts): CI's slow step; test_tx_status.py has the in-process one
def test_a_transfer_only_in_a_killed_nodes_outbox_lands_in_one_block_after_its_restart(tmp_path):
    """Issue 28's outbox, through a real crash: a follower's wallet transfer is accepted while no validator can
    hear it (the follower has no peer), so it exists only in that node's mempool and its outbox file; the node is
    killed with SIGKILL and restarted, now dialling the validator; the transfer must land in exactly one block (read
    from the validator's reopened LevelDB) and the restarted wallet's next transfer takes the next nonce. Without
    the outbox load at start (``LedgerService.run``) the transfer is lost: its status stays unknown."""
    from node.encoding import BASE_UNITS
    from node.identity import Identity, dev_seed
    from node.ledger.genesis import load_genesis
    from node.ledger.outbox import Outbox
    from node.ledger.store import LedgerStore

    cache = tmp_path / "models"
    make_tiny(cache, 0)
    val, fol = (Identity.from_seed(dev_seed(i)).peer_id for i in (0, 1))
    genesis = tmp_path / "genesis.json"
    genesis.write_text(json.dumps({
        "chain_id": "tally-test-outbox", "validators": [val],
        "accounts": [{"account": val, "balance": "10", "bond": "200"}, {"account": fol, "balance": "10"}],
        "params": {"block_time_ms": 300}}))
    dv, df = tmp_path / "v", tmp_path / "f"
    procs: list = []

    def call(api: str, d: Path, path: str, body: dict | None = None) -> dict:
        if body is None:
            return httpx.get(f"{api}{path}", timeout=20).json()
        token = (d / "api_token").read_text().strip()
        r = httpx.post(f"{api}{path}", json=body, timeout=20, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        return r.json()

    try:
        procs.append(start(dv, cache, "--genesis", str(genesis), "--dev-account", "0"))  # no peer either
        procs.append(start(df, cache, "--genesis", str(genesis), "--dev-account", "1"))
        iv, i1 = info(dv, procs[0]), info(df, procs[1])
        wait_height(iv["api"], 1)
        sent = call(i1["api"], df, "/v1/transfer", {"to": val, "amount": "1"})
        assert sent["nonce"] == 0
        tid = sent["id"]
        assert call(i1["api"], df, f"/v1/txs/{tid}/status")["status"] == "pending"
        assert [t.id.hex() for t in Outbox(df / "ledger.outbox").load()] == [tid]  # on disk before the answer
        assert status(i1["api"])["peers"] == [] and status(iv["api"])["peers"] == []  # nobody heard it
        assert call(iv["api"], dv, f"/v1/txs/{tid}/status")["status"] == "unknown"
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        procs[1] = start(df, cache, "--genesis", str(genesis), "--bootstrap", iv["addrs"][0])
        i2 = info(df, procs[1])
        assert i2["peer_id"] == fol
        deadline = time.monotonic() + 30
        st = {}
        while time.monotonic() < deadline:
            st = call(i2["api"], df, f"/v1/txs/{tid}/status")
            if st["status"] == "included":
                break
            time.sleep(0.3)
        assert st["status"] == "included", f"30 s after the restart the transfer is {st}"
        again = call(i2["api"], df, "/v1/transfer", {"to": val, "amount": "1"})
        assert again["nonce"] == 1  # the restarted wallet counts the re-queued transfer
        deadline = time.monotonic() + 30
        while call(iv["api"], dv, f"/v1/txs/{again['id']}/status")["status"] != "included":
            assert time.monotonic() < deadline, "the restarted wallet's next transfer did not land"
            time.sleep(0.3)
        stop_all(procs)
        store = LedgerStore(dv / "ledger", load_genesis(genesis))
        try:
            where = [h for h in range(1, store.head + 1) for tx in store.get_block(h)[0].txs if tx.id.hex() == tid]
            assert len(where) == 1, f"the transfer is in blocks {where}"
            acc = store.replay().account(Identity.from_seed(dev_seed(1)).account)
            assert (acc.balance, acc.nonce) == (8 * BASE_UNITS, 2)  # two transfers of 1 credit, each applied once
        finally:
            store.close()
    finally:
        stop_all(procs)
