"""Issue 24 check 2, with real workers as processes: a copied Δ is refused. Every node is its own ``node start``
process (libp2p on 127.0.0.1, LevelDB, the tiny random Llama): the validator posts the run, worker 1 is honest and
worker 2 runs ``--fault run-copyroot``: it trains nothing, waits for another participant's round receipt on the
ledger and submits it as its own (its account and signature, the other's Δ root). The ledger refuses it (a Δ root is
committed once per round attempt), so the attempt's commit phase closes at its timeout with the honest Δ alone; the
copier holds no receipt, is paid nothing and keeps its bond, and credits are conserved in the validator's LevelDB,
reopened after the validator is SIGKILLed.

Only what needs the processes is here (the copier's worker code against a real ledger, over gossip): the run asks
for two workers, so the attempt with the copier fails for want of a second commitment and the test stops there.
How a round goes on without the copy (the honest Δs aggregated once each, every worker paid once; the copy and its
original in one block) is played on the ledger state machine by ``tests/ledger/test_runs.py``: its tests
``test_a_copied_delta_root_is_refused_and_the_round_pays_each_delta_once`` and
``test_a_duplicate_root_in_one_block_lands_once``.
"""

from __future__ import annotations

import json
import re
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
HONEST, COPIER = 1, 2
ROUND_TIMEOUT = 40  # blocks (8 s at 200 ms): the commit phase waits this long for the copier, which never lands
# min_workers = max_workers = 2: the round opens only with both joined (the copier in it whatever the join order)
RUN = {
    "title": "copy", "text": TEXT, "rank": 4, "targets": "q_proj,v_proj", "seed": 3, "lr": 0.01, "batch_size": 2,
    "seq_len": 16, "inner_steps": 2, "inner_state": "reset", "screen_windows": 2, "rounds": 1, "min_workers": 2,
    "max_workers": 2, "outer_lr": 1.0, "outer_momentum": 0.0, "clip": 2.0, "codec": "int8",
    "price_per_step": "0.01", "aggregator_fee": "0.01", "sample_ppm": 0, "round_timeout": ROUND_TIMEOUT,
    "deadline_blocks": 20_000,
}
REFUSED = re.compile(r"run-copyroot: round 0: the copy of (\w+)'s Δ root (\w+) was refused: (.*)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def _info(tmp: Path, key: int) -> dict:
    return json.loads((tmp / f"p{key}" / "node.json").read_text())


def _wait(what: str, fn, timeout: float):
    end = time.monotonic() + timeout
    while (x := fn()) is None or x is False:
        assert time.monotonic() < end, f"{what}: not within {timeout} s"
        time.sleep(0.2)
    return x


@pytest.mark.slow  # three `node start` processes on 2 shared cores and one commit phase of ROUND_TIMEOUT blocks
def test_a_copied_delta_root_is_refused_with_real_workers(tmp_path, tiny):
    # receipts sampled at 0.1 % (no committee duty, no fee, during the test): max_receipt_price bounded to match
    gfile = write_genesis(tmp_path, servers=[HONEST, COPIER], clients=[], sample_base_ppm=1000,
                          sample_floor_ppm=1000, max_receipt_price=10**8)
    g = load_genesis(gfile)
    supply0 = genesis_supply(gfile)
    port = free_port()
    procs: dict[int, subprocess.Popen] = {0: spawn(tmp_path, 0, gfile, tiny.parent, "--port", str(port))}
    copier, honest = peer(COPIER), peer(HONEST)
    try:
        for k in (HONEST, COPIER):
            extra = ("--fault", "run-copyroot") if k == COPIER else ()
            procs[k] = spawn(tmp_path, k, gfile, tiny.parent, "--bootstrap", validator_addr(port), *extra)
        for k in procs:
            wait_info(tmp_path, k, procs[k], 300)
        run_id = api_call(tmp_path, 0, "POST", "/v1/runs", json=RUN)["run_id"]
        for k in (HONEST, COPIER):
            _wait(f"the run on node {k}'s ledger",
                  lambda k=k: api_get(_info(tmp_path, k), f"/v1/runs/{run_id}", missing_ok=True), 60)
            api_call(tmp_path, k, "POST", f"/v1/runs/{run_id}/join")
        log = tmp_path / f"p{COPIER}" / "node.log"

        def attempt_failed():  # the copier's refusal logged, and the attempt it was in closed for want of its commit
            for k, p in procs.items():
                assert p.poll() is None, f"node {k} exited {p.returncode}:\n{tail(tmp_path, k)}"
            text = log.read_text(errors="replace") if log.exists() else ""
            assert "was accepted" not in text, text[-3000:]  # run-copyroot: the copy landed
            copies = [m.groups() for m in REFUSED.finditer(text)]
            if not copies:
                return None
            run = api_get(_info(tmp_path, 0), f"/v1/runs/{run_id}")
            return next(((run, f, c) for f in run["failed"] for c in copies
                         if any((w["delta"] or "").startswith(c[1]) for w in f["workers"])), None)

        run, f0, (victim, root_prefix, why) = _wait("a refused copy and the end of its attempt", attempt_failed, 240)
        kill(procs[0])  # the validator crashes: its ledger must open and hold the same run
        procs[0].wait(timeout=10)
    except BaseException:
        for k in procs:
            print(f"--- node {k} ---", tail(tmp_path, k), sep="\n")
        raise
    finally:
        stop_all(procs.values())

    # the copier tried, with the honest worker's Δ root of an attempt, and its ledger said why it refused
    assert account_from_str(honest).hex().startswith(victim), (victim, honest)
    assert "already committed this delta_root" in why, why
    # that attempt: both were participants, only the honest worker committed; it failed for want of a second
    attempts = {(a["round"], a["attempt"]): a["participants"] for a in run["ledger"]["attempts"]}
    assert f0["reason"] == "1 committed", f0
    assert {account_from_str(p).hex() for p in (honest, copier)} == set(attempts[(f0["round"], f0["attempt"])])
    assert [w["worker"] for w in f0["workers"]] == [honest], f0["workers"]
    assert f0["workers"][0]["delta"].startswith(root_prefix), (f0["workers"], root_prefix)
    store = LedgerStore(tmp_path / "p0" / "ledger", g)
    try:
        st = store.replay()
        assert st.supply() == supply0  # balances + bonds + escrows = genesis supply, in the reopened LevelDB
        receipts = [tx for h in range(1, st.height + 1) for tx in store.get_block(h)[0].txs
                    if isinstance(tx, RoundReceipt) and tx.run_id.hex() == run_id]
        assert receipts and {tx.worker for tx in receipts} == {account_from_str(honest)}  # none by the copier
        assert any(tx.delta_root.hex().startswith(root_prefix) for tx in receipts)
        assert len({tx.delta_root for tx in receipts}) == len(receipts)  # each root committed once
        mine = st.account(account_from_str(copier))  # paid nothing, slashed nothing: as in genesis
        assert (mine.balance, mine.bond) == next((b, bo) for a, b, bo in g.balances if a == account_from_str(copier))
    finally:
        store.close()
