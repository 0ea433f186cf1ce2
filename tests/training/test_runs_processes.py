"""Collaborative training runs with every node its own ``node start`` process (libp2p on 127.0.0.1, LevelDB, the
tiny random Llama): the issue's check 4, a worker SIGKILLed in the middle of a round and a new worker joining
later. Six nodes in one trio loop starved each other on two cores (round 1 never opened within 400 s); as
processes each node has its own loop, as in ``tests/inference/test_processes.py``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from node.compute.model import make_tiny
from node.identity import account_from_str
from node.ledger.core.runstate import runs_of
from node.ledger.core.runtx import RoundReveal
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
HONEST, VICTIM, LATE = (1, 2, 3), 4, 5
ROUND_TIMEOUT = 100  # blocks (20 s at 200 ms): how long a round's commit phase waits for a dead participant
# the run in the API's user units; five rounds (0..4): the late worker joins while round 2 is open and must
# contribute in round 3 (θ_3) or, if its first load is slow on shared cores, round 4
RUN = {
    "title": "kill", "text": TEXT, "rank": 4, "targets": "q_proj,v_proj", "seed": 3, "lr": 0.01, "batch_size":
    2, "seq_len": 16, "inner_steps": 6, "inner_state": "reset", "screen_windows": 2, "rounds": 5, "min_workers":
    3, "max_workers": 5, "outer_lr": 1.0, "outer_momentum": 0.0, "clip": 2.0, "codec": "int8", "price_per_step":
    "0.01", "aggregator_fee": "0.01", "sample_ppm": 0, "round_timeout": ROUND_TIMEOUT, "deadline_blocks":
    20_000,
}
THETA_LINE = re.compile(r"run ([0-9a-f]{12}) round (\d+): θ ([0-9a-f]{64}) fetched by hash and re-computed from "
                        r"round (\d+)'s (\d+) accepted Δs: matches the ledger")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def _watch(tmp, procs, run_id: str, timeout: float) -> dict:
    """Follow the run on the validator's API (every 0.1 s) until it is finished or expired. SIGKILL the victim in
    round 1's commit phase before its receipt is on the ledger; once round 2 is open, the late worker (up and
    bonded since the start, but not joined: it has trained nothing) joins. Returns what was seen:
    ``killed_commits`` (who had committed at the kill), ``r1_waiting`` (round 1's opened height and attempt
    when it was seen in its commit phase with every live participant's commit in), ``joined_at`` (the run's round and
    phase when the late join was sent), ``run`` (the final view)."""
    seen: dict = {}
    deadline = time.monotonic() + timeout
    victim, late = peer(VICTIM), peer(LATE)
    run = None
    while time.monotonic() < deadline:
        for k, p in procs.items():
            assert (k == VICTIM and "killed_commits" in seen) or p.poll() is None, \
                f"node {k} exited {p.returncode}:\n{tail(tmp, k)}"
        run = api_get(procs_info(tmp, 0), f"/v1/runs/{run_id}", missing_ok=True)
        if run is None:
            time.sleep(0.1)
            continue
        if run["status"] in ("finished", "expired"):
            seen["run"] = run
            return seen
        cur = run["current"]
        if cur and cur["round"] == 1 and "killed_commits" not in seen and victim in cur["participants"]:
            committed = [c["worker"] for c in cur["commits"]]
            if cur["phase"] != "commit" or victim in committed:
                seen.update(killed_commits=None, run=run)  # missed the window: the test fails with what was seen
                return seen
            kill(procs[VICTIM])
            procs[VICTIM].wait(timeout=10)
            seen["killed_commits"] = committed
        if (cur and cur["round"] == 1 and cur["phase"] == "commit" and "r1_waiting" not in seen
                and {c["worker"] for c in cur["commits"]} == {peer(k) for k in HONEST}):
            # every live participant has committed and the phase is still open: it waits for the dead one (a
            # state that lasts about ROUND_TIMEOUT blocks; the reveal phase after it may pass between two polls)
            seen["r1_waiting"] = (cur["opened"], cur["attempt"])
        if run["round"] >= 2 and "joined_at" not in seen:
            acc = api_get(procs_info(tmp, LATE), f"/v1/accounts/{late}")
            if acc["eligible"]:  # its bond is on the late node's ledger: a join passes its checks
                api_call(tmp, LATE, "POST", f"/v1/runs/{run_id}/join")
                seen["joined_at"] = (run["round"], cur and cur["phase"])
        time.sleep(0.1)
    raise AssertionError(f"run not over within {timeout} s; seen {seen}; last {run and _brief(run)}")


def procs_info(tmp, key: int) -> dict:
    """The ``node.json`` of the ``spawn``-ed node of dev key ``key`` (its API address)."""
    return json.loads((tmp / f"p{key}" / "node.json").read_text())


def _brief(run: dict) -> dict:
    return {"status": run["status"], "round": run["round"], "current": run["current"] and {
        k: run["current"][k] for k in ("round", "attempt", "phase", "opened", "phase_height")},
        "failed": run["failed"]}


@pytest.mark.slow  # seven `node start` processes on 2 shared cores, five rounds, four of them waiting for a timeout
def test_a_killed_worker_and_a_late_joiner(tmp_path, tiny):
    """Check 4: workers 1-4 join at the start; worker 4 is SIGKILLed in round 1's commit phase, before its round
    receipt is on the ledger. Round 1 closes its commit phase at the round timeout and completes with the three
    others. A new worker (5; its node is up and bonded from the start but has not joined or trained) joins
    while round 2 is open: in its first round it fetches θ by hash, re-computes it from the previous
    round's accepted Δs (its log says it matches the ledger), and its Δ is accepted in round 3 or 4. Every
    accepted contribution is paid once; credits are conserved, on the live API and in the validator's LevelDB
    opened after the validator is SIGKILLed."""
    # a dead worker stays joined and bonded: each later round's commit phase waits ROUND_TIMEOUT blocks for it, and
    # every committee drawn with it in waits verdict_timeout blocks, then escalates to one twice the size (in the
    # end every eligible account, where a 2/3 quorum needs every live member's vote within verdict_timeout).
    # 300 blocks (60 s at 200 ms; blocks come slower under load): a replay and vote was seen to take 40-60 s at
    # load 14 on the 2 shared cores, and 100 blocks let whole aggregates settle unverified, round after round.
    # The late worker is funded, not bonded at genesis: it bonds once its node is up (a node that is not running
    # must not be drawn into committees).
    # Sampling 5 % of round receipts (every aggregate is re-computed): p·S > (1 − p)·G holds, 5 > 4.75 credits
    gfile = write_genesis(tmp_path, servers=[*HONEST, VICTIM], clients=[LATE], verdict_timeout=300,
                          sample_base_ppm=50_000, sample_floor_ppm=50_000)
    supply0 = genesis_supply(gfile)
    port = free_port()
    boot = ("--bootstrap", validator_addr(port))
    procs: dict[int, subprocess.Popen] = {0: spawn(tmp_path, 0, gfile, tiny.parent, "--port", str(port))}
    t0 = time.monotonic()
    times: dict[str, float] = {}
    try:
        # the validator first: started together with six importing processes at load 15, its connections to
        # them once stopped taking new streams for good (sync and blob requests timed out for 10 minutes while
        # gossip flowed; see the session report), so the workers dial a validator that is already up.
        # Up to 300 s each: on two cores under other tests' load, imports alone were seen to take 150 s
        wait_info(tmp_path, 0, procs[0], 300)
        for k in (*HONEST, VICTIM, LATE):
            procs[k] = spawn(tmp_path, k, gfile, tiny.parent, *boot)
        for k in procs:
            wait_info(tmp_path, k, procs[k], 300)
        times["up"] = time.monotonic() - t0
        # the late worker bonds now and sits on committees from here on: with the victim dead, a committee of
        # the 3 other eligible accounts needs all 3 votes for its 2/3 quorum, so one dead member of 4 eligible
        # stalls every such aggregate (unverified, another aggregator drawn, forever; seen: see the report)
        api_call(tmp_path, LATE, "POST", "/v1/bond", json={"amount": "200"})
        posted = api_call(tmp_path, 0, "POST", "/v1/runs", json=RUN)
        run_id = posted["run_id"]
        for k in (*HONEST, VICTIM):
            end = time.monotonic() + 60
            while api_get(procs_info(tmp_path, k), f"/v1/runs/{run_id}", missing_ok=True) is None:
                assert time.monotonic() < end, f"run not on node {k}'s ledger within 60 s"
                time.sleep(0.2)
            api_call(tmp_path, k, "POST", f"/v1/runs/{run_id}/join")
        seen = _watch(tmp_path, procs, run_id, timeout=1500)
        times["run"] = time.monotonic() - t0
        status = api_get(procs_info(tmp_path, 0), "/v1/status")
        late_log = (tmp_path / f"p{LATE}" / "node.log").read_text(errors="replace")
        kill(procs[0])  # the validator crashes: its ledger must open and hold the same run
        procs[0].wait(timeout=10)
    except BaseException:
        for k in procs:
            print(f"--- node {k} ---", tail(tmp_path, k), sep="\n")
        raise
    finally:
        stop_all(procs.values())
    print("phase times (s):", {k: round(v, 1) for k, v in times.items()}, "seen:",
          {k: v for k, v in seen.items() if k != "run"})
    run = seen["run"]
    assert seen["killed_commits"] is not None, f"the victim committed before it could be killed: {_brief(run)}"
    assert procs[VICTIM].returncode == -signal.SIGKILL
    assert run["status"] == "finished", _brief(run)
    victim, late = peer(VICTIM), peer(LATE)
    rounds = {r["round"]: r for r in run["rounds_detail"]}
    assert sorted(rounds) == [0, 1, 2, 3, 4]

    # round 1: it completed with the three others, in its first attempt, its commit phase closed at the timeout
    r1 = rounds[1]
    assert r1["attempt"] == 0 and not [f for f in run["failed"] if f["round"] == 1], run["failed"]
    assert set(r1["accepted"]) == {peer(k) for k in HONEST}, r1
    assert {"worker": victim, "reason": "not committed"} in r1["excluded"], r1["excluded"]
    assert "r1_waiting" in seen, "round 1 was never seen waiting for the dead worker with every other commit in"
    opened, attempt = seen["r1_waiting"]
    assert attempt == 0

    # the late worker joined while round 2 was open and contributed a valid Δ in round 3 or 4
    assert seen["joined_at"][0] == 2, seen["joined_at"]
    assert late not in rounds[2]["accepted"] and all(w["worker"] != late for w in rounds[2]["workers"])
    first = min(r for r in (3, 4) if late in rounds[r]["accepted"]) if any(
        late in rounds[r]["accepted"] for r in (3, 4)) else None
    assert first is not None, {r: rounds[r]["excluded"] for r in (3, 4)}
    (mine,) = [w for w in rounds[first]["workers"] if w["worker"] == late]
    assert mine["status"] in ("valid", "settled"), mine
    # its θ of that round was fetched by hash and re-computed from the previous round's accepted Δs before it
    # trained: the log line names the id the ledger holds as that round's starting parameters
    checks = {(int(m.group(2)), m.group(3)) for m in THETA_LINE.finditer(late_log) if run_id.startswith(m.group(1))}
    assert (first, rounds[first]["params_before"]) in checks, (first, checks)
    assert rounds[first]["params_before"] == rounds[first - 1]["params_next"]

    # every accepted contribution was paid exactly once (the price, less the committee's fee when it was replayed
    # and found valid); the escrow is empty; credits are conserved
    fee = int(run["receipt_price"]["base_units"]) * load_genesis(gfile).params.committee_fee_bps // 10_000
    price = int(run["receipt_price"]["base_units"])
    def owed(w):  # a valid verdict's committee fee comes out of the worker's price
        return price - (fee if w["status"] == "valid" else 0)

    paid = sum(owed(w) for r in rounds.values() for w in r["workers"] if w["accepted"])
    assert int(run["escrow_left"]["base_units"]) == 0
    assert int(status["supply"]["base_units"]) == supply0
    store = LedgerStore(tmp_path / "p0" / "ledger", load_genesis(gfile))
    try:
        st = store.replay()
        assert st.supply() == supply0  # balances + bonds + escrows = genesis supply, in the reopened LevelDB
        stored = runs_of(st)[bytes.fromhex(run_id)]
        # round 1's commit phase closed at its timeout: no reveal of it is in a block before opened + ROUND_TIMEOUT
        r1_reveals = [h for h in range(1, st.height + 1) for tx in store.get_block(h)[0].txs
                      if isinstance(tx, RoundReveal) and tx.run_id.hex() == run_id and tx.round == 1]
        assert len(r1_reveals) == len(HONEST) and min(r1_reveals) >= opened + ROUND_TIMEOUT, (opened, r1_reveals)
        assert stored.status.value == "finished" and stored.round == 5
        # an attempt re-opened for lack of workers (rounds 2-4 can miss a window on loaded cores) paid the work
        # done as asked: every commit if the commit phase failed, the revealed ones if the reveal phase did
        revealed = {(tx.round, tx.attempt, tx.worker) for h in range(1, st.height + 1)
                    for tx in store.get_block(h)[0].txs if isinstance(tx, RoundReveal) and tx.run_id.hex() == run_id}
        for f in run["failed"]:
            for w in f["workers"]:
                if w["status"] != "invalid" and (f["reason"].endswith("committed") or (
                        f["round"], f["attempt"], account_from_str(w["worker"])) in revealed):
                    paid += owed(w)
        assert int(run["paid_workers"]["base_units"]) == paid, (run["failed"], paid)
        assert st.account(account_from_str(peer(0))).escrow == 0
    finally:
        store.close()
