"""Issue 37, check 3 with real processes: a server killed with SIGKILL mid-epoch, after its sessions and before its
epoch batch, is paid after restart for every receipt its requester signed, and nothing twice.

Three ``node start`` processes on a tally-test chain whose genesis turns tabs on (an epoch of 30 blocks of
500 ms, every receipt drawn): the validator, which also generates (it opens a tab per server), and two servers of
the tiny model's whole span (each the other's committee). The server that served the generation is killed as soon
as its node log shows the sessions settled (their receipts are in its epoch book on disk), then restarted from the
same data dir; its batch covers them, the other server re-executes and votes, and the worker is paid. The
generations start in the first blocks of an epoch, and the kill is checked to fall in that same epoch: under CI's
load an epoch of 20 blocks once ended (and the batch was sent) before the kill, so the fault did not happen."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from node.compute.model import make_tiny
from node.devnet import devnet_genesis

from .test_processes import ROOT, info, start, stop_all

EPOCH = 30
PARAMS = {"epoch_blocks": EPOCH, "batch_samples": 1000, "reveal_window": 20, "settle_window": 2,
          "tab_close_delay": 100}


def _get(api: str, path: str) -> dict:
    return httpx.get(f"{api}{path}", timeout=10).json()


def _next_epoch_start(api: str) -> int:
    """Wait until the chain is in the first two blocks of an epoch (at most ~1.5 epochs); returns the epoch."""
    deadline = time.monotonic() + 1.5 * EPOCH * 0.5 + 30
    while (h := _get(api, "/v1/status")["height"]) % EPOCH > 1:
        assert time.monotonic() < deadline, f"no epoch started (height {h})"
        time.sleep(0.1)
    return h // EPOCH


# alone: the fault is a kill inside one epoch of 15 s, which two other xdist workers' load turned into a kill
# after the tab was already partly redeemed (CI at 9a3782f); alone it passes in about a minute
@pytest.mark.slow  # four node processes, a kill and a restart, an epoch of 15 s: about a minute on 2 cores
@pytest.mark.alone
def test_a_server_killed_mid_epoch_is_paid_after_restart_once(tmp_path):
    cache = tmp_path / "models"
    make_tiny(cache, 0)
    doc = devnet_genesis(2)
    doc["params"].update(PARAMS)
    gfile = tmp_path / "genesis.json"
    gfile.write_text(json.dumps(doc))
    dirs = [tmp_path / f"n{i}" for i in range(3)]
    procs = []
    try:
        procs.append(start(dirs[0], cache, "--genesis", str(gfile), "--dev-account", "0"))
        i0 = info(dirs[0], procs[0])
        for k in (1, 2):
            procs.append(start(dirs[k], cache, "--genesis", str(gfile), "--dev-account", str(k), "--span", "0:6",
                               "--bootstrap", i0["addrs"][0]))
        infos = [i0, info(dirs[1], procs[1]), info(dirs[2], procs[2])]
        token = (dirs[0] / "api_token").read_text().strip()
        http = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"})
        deadline = time.monotonic() + 60
        while len(_get(i0["api"], "/v1/status")["swarm"]) < 2:
            assert time.monotonic() < deadline, "the servers were not announced"
            time.sleep(0.3)
        epoch = _next_epoch_start(i0["api"])
        gens = [http.post(f"{i0['api']}/v1/generate", json={"prompt_ids": [5, 17, 42], "max_new_tokens": 4}).json()
                for _ in range(2)]
        # kill the server of the first generation (routes follow measured speed: under load the second may have
        # gone to the other server, seen in CI); its sessions are those it served
        victim = gens[0]["route"][0]["peer"]
        k = next(i for i in (1, 2) if infos[i]["peer_id"] == victim)
        mine = [g for g in gens if g["route"][0]["peer"] == victim]
        log = dirs[k] / "node.log"
        deadline = time.monotonic() + 30
        while len(re.findall(r"session \w+ from \w+ settled \(closed\)", log.read_text())) < len(mine):
            assert time.monotonic() < deadline, "the sessions did not settle on the server"
            time.sleep(0.1)
        height_killed = _get(i0["api"], "/v1/status")["height"]
        procs[k].send_signal(signal.SIGKILL)
        procs[k].wait()
        assert height_killed // EPOCH == epoch, (  # the fault under test: a kill before the epoch's batch
            f"the sessions of epoch {epoch} settled only at height {height_killed}: not killed mid-epoch")
        tabs = _get(i0["api"], f"/v1/accounts/{infos[k]['peer_id']}/tabs")
        assert tabs["tabs"] and int(tabs["tabs"][0]["redeemed"]["base_units"]) == 0  # not paid yet: mid-epoch
        procs[k] = start(dirs[k], cache, "--genesis", str(gfile), "--dev-account", str(k), "--span", "0:6",
                         "--bootstrap", i0["addrs"][0])
        info(dirs[k], procs[k])
        deadline = time.monotonic() + 150
        while True:  # the batch sent after restart, drawn, revealed, voted on and paid
            t = _get(i0["api"], f"/v1/accounts/{infos[k]['peer_id']}/tabs")
            if int(t["tabs"][0]["redeemed"]["base_units"]) > 0 and t["open_batches"] == 0:
                break
            assert time.monotonic() < deadline, t
            time.sleep(0.5)
        recs = [_get(i0["api"], f"/v1/receipts/{rid}") for g in mine for rid in g["receipts"]]
        status_after = _get(i0["api"], "/v1/status")["height"]
        time.sleep(6)  # more blocks: nothing more is paid
        again = _get(i0["api"], f"/v1/accounts/{infos[k]['peer_id']}/tabs")
        wallet = subprocess.run([sys.executable, "-m", "node.cli", "wallet", "--data-dir", str(dirs[0]), "tabs"],
                                capture_output=True, text=True, timeout=60, cwd=ROOT)
    finally:
        stop_all(procs)
    signed = max(int(r["fields"]["cumulative"]) for r in recs)
    assert [r["status"] for r in recs] == ["valid"] * len(mine)  # its sessions' receipts drawn, revealed, valid
    assert int(t["tabs"][0]["redeemed"]["base_units"]) == signed  # every signed credit redeemed
    assert again["tabs"] == t["tabs"] and status_after > height_killed
    assert wallet.returncode == 0, wallet.stderr  # the requester's wallet shows the tab it pays through
    redeemed = t["tabs"][0]["redeemed"]["credits"]
    assert f"pays {infos[k]['peer_id']}" in wallet.stdout and f"redeemed {redeemed} credits" in wallet.stdout, \
        wallet.stdout
