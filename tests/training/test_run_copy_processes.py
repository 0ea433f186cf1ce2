"""Issue 24 check 2, with real workers as processes: a copied Δ is refused. Every node is its own ``node start``
process (libp2p on 127.0.0.1, LevelDB, the tiny random Llama). Workers 1-3 are honest; worker 4 runs
``--fault run-copyroot``: it trains nothing, waits for another participant's round receipt on the ledger and submits
it as its own (its account and signature, the other's Δ root). The ledger refuses it (a Δ root is committed once
per round attempt); the round closes its commit phase at the timeout and completes with the three honest Δs, each
aggregated once; the copier is paid nothing; credits are conserved in the validator's LevelDB, reopened after the
validator is SIGKILLed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from node.compute.model import make_tiny
from node.identity import account_from_str
from node.ledger.core.runtx import RoundReceipt
from node.ledger.genesis import load_genesis
from node.ledger.store import LedgerStore

from ..inference.procs import (
    api_call,
    api_get,
    free_port,
    genesis_supply,
    kill,
    peer,
    spawn,
    stop_all,
    tail,
    validator_addr,
    wait_info,
    write_genesis,
)

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_text()
HONEST, COPIER = (1, 2, 3), 4
ROUND_TIMEOUT = 100  # blocks (20 s at 200 ms): the commit phase waits this long for the copier, which never lands
# max_workers 8 with 4 joined: the budget covers 8 receipts, so attempts that fail on loaded cores (their receipts
# are paid on a valid verdict) do not drain the escrow before one completes ("the run's escrow cannot pay this
# receipt" was seen with max_workers 4, the run then never finished)
RUN = {
    "title": "copy", "text": TEXT, "rank": 4, "targets": "q_proj,v_proj", "seed": 3, "lr": 0.01, "batch_size":
    2, "seq_len": 16, "inner_steps": 6, "inner_state": "reset", "screen_windows": 2, "rounds": 1, "min_workers":
    3, "max_workers": 8, "outer_lr": 1.0, "outer_momentum": 0.0, "clip": 2.0, "codec": "int8", "price_per_step":
    "0.01", "aggregator_fee": "0.01", "sample_ppm": 0, "round_timeout": ROUND_TIMEOUT, "deadline_blocks":
    20_000,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def _info(tmp: Path, key: int) -> dict:
    return json.loads((tmp / f"p{key}" / "node.json").read_text())


@pytest.mark.quarantine  # passed in 170 s on a quiet tree; at load 17-21 two runs did not finish in 900/1500 s
@pytest.mark.slow  # five `node start` processes on 2 shared cores; one round that waits ROUND_TIMEOUT for the copier
def test_a_copied_delta_root_is_refused_with_real_workers(tmp_path, tiny):
    gfile = write_genesis(tmp_path, servers=[*HONEST, COPIER], clients=[], verdict_timeout=300,
                          sample_base_ppm=50_000, sample_floor_ppm=50_000)
    supply0 = genesis_supply(gfile)
    port = free_port()
    procs: dict[int, subprocess.Popen] = {0: spawn(tmp_path, 0, gfile, tiny.parent, "--port", str(port))}
    run = None
    try:
        wait_info(tmp_path, 0, procs[0], 300)
        for k in (*HONEST, COPIER):
            extra = ("--fault", "run-copyroot") if k == COPIER else ()
            procs[k] = spawn(tmp_path, k, gfile, tiny.parent, "--bootstrap", validator_addr(port), *extra)
        for k in procs:
            wait_info(tmp_path, k, procs[k], 300)
        run_id = api_call(tmp_path, 0, "POST", "/v1/runs", json=RUN)["run_id"]
        for k in (*HONEST, COPIER):
            end = time.monotonic() + 60
            while api_get(_info(tmp_path, k), f"/v1/runs/{run_id}", missing_ok=True) is None:
                assert time.monotonic() < end, f"run not on node {k}'s ledger within 60 s"
                time.sleep(0.2)
            api_call(tmp_path, k, "POST", f"/v1/runs/{run_id}/join")
        end = time.monotonic() + 1500  # attempts fail and re-open with longer phases while the cores are loaded
        while time.monotonic() < end:
            for k, p in procs.items():
                assert p.poll() is None, f"node {k} exited {p.returncode}:\n{tail(tmp_path, k)}"
            run = api_get(_info(tmp_path, 0), f"/v1/runs/{run_id}", missing_ok=True)
            if run is not None and run["status"] in ("finished", "expired"):
                break
            time.sleep(0.5)
        assert run is not None and run["status"] == "finished", run and {k: run[k] for k in ("status", "round")}
        copier_log = (tmp_path / f"p{COPIER}" / "node.log").read_text(errors="replace")
        kill(procs[0])  # the validator crashes: its ledger must open and hold the same run
        procs[0].wait(timeout=10)
    except BaseException:
        for k in procs:
            print(f"--- node {k} ---", tail(tmp_path, k), sep="\n")
        raise
    finally:
        stop_all(procs.values())

    copier, honest = peer(COPIER), {peer(k) for k in HONEST}
    # the copier tried, and the ledger said why it refused
    assert "run-copyroot: round 0: the copy of" in copier_log and "was refused" in copier_log, copier_log[-3000:]
    assert "already committed this delta_root" in copier_log
    assert "was accepted" not in copier_log
    (r0,) = run["rounds_detail"]
    # the honest Δs are aggregated (one whose blob the aggregator could not fetch in time on loaded cores is left
    # out as any unavailable Δ is; seen once: 2 of 3), the copier's never: it has none
    assert set(r0["accepted"]) <= honest and len(r0["accepted"]) >= 2, (r0["accepted"], r0["excluded"])
    assert {"worker": copier, "reason": "not committed"} in r0["excluded"], r0["excluded"]
    (mine,) = [w for w in r0["workers"] if w["worker"] == copier]
    assert mine["receipt"] is None and not mine["accepted"], mine  # no receipt of it, so nothing to pay it
    assert all(w["worker"] != copier for f in run["failed"] for w in f["workers"]), run["failed"]
    store = LedgerStore(tmp_path / "p0" / "ledger", load_genesis(gfile))
    try:
        st = store.replay()
        assert st.supply() == supply0  # balances + bonds + escrows = genesis supply, in the reopened LevelDB
        receipts = [tx for h in range(1, st.height + 1) for tx in store.get_block(h)[0].txs
                    if isinstance(tx, RoundReceipt) and tx.run_id.hex() == run_id]
        assert {tx.worker for tx in receipts} == {account_from_str(w) for w in honest}  # none by the copier
        roots = [tx.delta_root for tx in receipts]
        assert len(set(roots)) == len(roots) >= 3  # each Δ committed once (every attempt), so aggregated once
        stored = st.runs[bytes.fromhex(run_id)]
        assert stored.status.value == "finished"
        assert set(stored.history[0].accepted) == {account_from_str(w) for w in r0["accepted"]}
    finally:
        store.close()
