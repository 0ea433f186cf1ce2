"""The issue's failover check with the real SmolLM2-135M over real libp2p processes (slow): 3 spans of 10
blocks, two servers each, every node its own process on 127.0.0.1 — a validator and six servers (``node start
--model smollm2``) and the client (``client_proc.py``). The middle span's server in the route is SIGKILLed after
token 17 of 48; the tokens equal one-process generation, the dead server's receipt covers exactly the steps the
client acknowledged (tokens 1-17), the replacement's the rest, the client pays each position once, and
committees (the server processes) re-execute and accept every receipt. The test process only reads: the client's
stdout, the validator's HTTP API.

(``test_real_model.py`` runs the same failover on the in-memory network of ``fakenet.py``, with fp16 sessions.)
Uses the default model cache (``ensure_smollm2``)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from node.compute.model import ensure_smollm2
from node.compute.reference import local_generate
from node.identity import account_from_str
from node.ledger.core.state import VALID_S
from node.ledger.genesis import load_genesis

from .procs import (
    balance,
    free_port,
    kill,
    peer,
    spawn,
    spawn_client,
    stop_all,
    tail,
    validator_addr,
    wait_exit,
    wait_final_api,
    wait_info,
    write_genesis,
)

PROMPT = "The three most important inventions in human history are"
SERVERS = {1: (0, 10), 2: (0, 10), 3: (10, 20), 4: (10, 20), 5: (20, 30), 6: (20, 30)}  # dev key -> span
MIDDLE = (10, 20)
CLIENT = 7  # dev key of the client; dev key 0 is the validator


@pytest.mark.slow  # minutes: eight processes, six of them load the real model, on shared cores
@pytest.mark.soak  # ~2.3 min; tests/inference/test_processes.py (tiny model, node start processes) covers it in CI
# Was quarantined (0 of 3 at load 14-17: stream negotiations timed out) until the start was sequenced, idle blocks
# made quiet (heartbeat 5 s), the client's tokenizer/head loaded off its event loop, and the client kept up until
# the verdicts (--linger: the killed server's receipt is verified from the blobs the client stored). 3 of 3 passed
# on a quiet machine: 80-146 s (verdicts 5-69 s: a committee drawn with the dead server escalates after 60 s).
def test_smollm2_server_process_killed_after_token_17_of_48_over_libp2p(tmp_path):
    model = ensure_smollm2()
    # Committees are drawn from the six bonded servers, the dead one included: a round it sits on cannot reach a
    # quorum and escalates after verdict_timeout; members re-execute real spans one at a time on shared cores, so
    # a round gets 60 s (120 blocks of 500 ms). Quiet when idle (heartbeat 5 s): measured with every process
    # started, eight idle nodes at a block per 500 ms kept every trio loop busy relaying blocks and presence
    # (each process used all the CPU it got on the loaded cores), so protocol negotiations waited > 10 s and
    # announcements (15 s ttl) expired; while a receipt is pending the chain keeps its 500 ms blocks
    gfile = write_genesis(tmp_path, servers=list(SERVERS), clients=[CLIENT], block_time_ms=500, verdict_timeout=120,
                          heartbeat_ms=5000)
    procs: dict[int, subprocess.Popen] = {}
    key_of = {peer(k): k for k in SERVERS}
    times: dict[str, float] = {}
    client = None
    try:
        t0 = time.monotonic()
        port = free_port()
        boot = validator_addr(port)
        # one after another, as an operator brings up a network: the validator listening before any server dials
        # it (a bootstrap dial to a process still importing times out and backs off), every server up before the
        # client looks for them
        procs[0] = spawn(tmp_path, 0, gfile, model.parent, "--port", str(port), model="smollm2")
        validator = wait_info(tmp_path, 0, procs[0], timeout=300)
        for k, (s, e) in SERVERS.items():  # the six load the model at once (each is its own process)
            procs[k] = spawn(tmp_path, k, gfile, model.parent, "--span", f"{s}:{e}", "--bootstrap", boot,
                             model="smollm2")
        for k in SERVERS:
            wait_info(tmp_path, k, procs[k], timeout=600)
        times["servers up"] = time.monotonic() - t0
        client, out = spawn_client(tmp_path, CLIENT, gfile, model, boot, len(SERVERS), 48, "--prompt-text", PROMPT,
                                   "--pause-at", "17", "--linger")
        # the client's balance in genesis: it only ever pays receipts
        (bal0,) = [b for a, b, _ in load_genesis(gfile).balances if a == account_from_str(peer(CLIENT))]
        prompt = json.loads(out.expect("PROMPT ", timeout=360).split(" ", 1)[1])
        times["start"] = time.monotonic() - t0
        t1 = time.monotonic()
        route = json.loads(out.expect("PAUSE ", timeout=300).split(" ", 1)[1])
        (dead,) = [p for p, s, e in route if (s, e) == MIDDLE]
        kill(procs[key_of[dead]])
        wait_exit(procs[key_of[dead]])
        client.stdin.write("go\n")
        client.stdin.flush()
        gen = json.loads(out.expect("RESULT ", timeout=300).split(" ", 1)[1])
        times["generate"] = time.monotonic() - t1
        t2 = time.monotonic()
        recs = wait_final_api(validator, [r["id"] for r in gen["receipts"]], timeout=480)
        times["verdicts"] = time.monotonic() - t2
        paid = bal0 - balance(validator, CLIENT)
        print("phase times (s):", {k: round(v, 1) for k, v in times.items()})
    except BaseException:
        for k in procs:  # what the nodes logged: why one did not come up, serve or vote
            print(f"--- node {k} ---", tail(tmp_path, k), sep="\n")
        raise
    finally:
        stop_all(procs.values())
        if client is not None:
            stop_all([client])
    _check(model, procs, key_of, prompt, gen, dead, recs, paid)


def _check(model, procs, key_of, prompt, gen, dead, recs, paid) -> None:
    assert gen["tokens"] == local_generate(model, prompt, 48)
    assert procs[key_of[dead]].returncode == -signal.SIGKILL
    (fo,) = gen["failovers"]
    assert fo["dead"] == dead and fo["token"] == 18 and fo["replayed"] == len(prompt) + 16
    receipts = gen["receipts"]
    assert len(receipts) == 4
    dead_r, new_r = [r for r in receipts if tuple(r["span"]) == MIDDLE]
    assert dead_r["worker"] == dead and new_r["worker"] != dead
    assert new_r["worker"] in {peer(k) for k, span in SERVERS.items() if span == MIDDLE}
    assert dead_r["tokens"] == len(prompt) + 16  # the acknowledged steps: those that produced tokens 1..17
    assert new_r["tokens"] == 31  # tokens 18..48; the replayed prefix is unbilled
    full = len(prompt) + 47
    assert [r["tokens"] for r in receipts if tuple(r["span"]) != MIDDLE] == [full, full]
    servers = {peer(k) for k in SERVERS}
    for r in receipts:  # the ledger holds the receipt the client kept, with its price
        rec = recs[r["id"]]
        assert (rec["worker"], rec["requester"], rec["span"], rec["tokens"]) == (
            r["worker"], peer(CLIENT), r["span"], r["tokens"])
        assert int(rec["price"]["base_units"]) == r["price"]
        # re-executed by its committee (other server processes, over libp2p) and accepted, no vote disagreeing
        assert rec["status"] == VALID_S, (rec["status"], rec["round"], rec["votes"])
        voters = {v["voter"] for v in rec["votes"]}
        assert voters and voters <= servers - {rec["worker"]}, (voters, rec["worker"])
        assert all(v["verdict"] == "valid" for v in rec["votes"]), rec["votes"]
    assert paid == sum(r["price"] for r in receipts)  # each receipt paid once, the replay not at all
