"""The issue's failover check with the real SmolLM2-135M over real libp2p (slow): 3 spans of 10 blocks, two
servers each, every server its own ``node start --model smollm2`` process on 127.0.0.1. The middle span's server
in the route is SIGKILLed after token 17 of 48; the tokens equal one-process generation, the dead server's
receipt covers exactly the steps the client acknowledged (tokens 1-17), the replacement's the rest, the client
pays each position once, and committees (the server processes) re-execute and accept every receipt.

(``test_real_model.py`` runs the same failover on the in-memory network of ``fakenet.py``, with fp16 sessions.)
Uses the default model cache (``ensure_smollm2``)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
import trio

from node.compute.model import ensure_smollm2
from node.compute.reference import local_generate
from node.identity import account_from_str
from node.ledger.state import VALID_S
from node.ledger.tx import VALID

from ..e2e.swarm import wait_final
from .procs import config, kill, peer, spawn, start_nodes, stop_all, wait_exit, write_genesis

PROMPT = "The three most important inventions in human history are"
SERVERS = {1: (0, 10), 2: (0, 10), 3: (10, 20), 4: (10, 20), 5: (20, 30), 6: (20, 30)}  # dev key -> span
MIDDLE = (10, 20)


async def wait_serving(client, procs: dict[int, subprocess.Popen], timeout: float) -> None:
    """Until ``client`` has heard every server process announce its span; fails at once if one has exited."""
    with trio.fail_after(timeout):
        while len(client.swarm.live(client.manifest.model_id)) < len(procs):
            gone = {k: p.returncode for k, p in procs.items() if p.poll() is not None}
            assert not gone, f"server processes exited before serving (dev key: exit status): {gone}"
            await trio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.quarantine  # passed 1 of 4 runs on the loaded 2-core machine: the in-process validator starved
def test_smollm2_server_process_killed_after_token_17_of_48_over_libp2p(tmp_path):
    model = ensure_smollm2()
    # six processes load the real model for a minute or more: blocks of 500 ms keep the ledger they sync small.
    # Committees are drawn from the six bonded servers, the dead one included: a round it sits on cannot reach a
    # quorum and escalates after verdict_timeout; members re-execute real spans one at a time on shared cores, so
    # a round gets 60 s (120 blocks)
    gfile = write_genesis(tmp_path, servers=list(SERVERS), clients=[0], block_time_ms=500, verdict_timeout=120)
    procs: dict[int, subprocess.Popen] = {}
    key_of = {peer(k): k for k in SERVERS}
    times: dict[str, float] = {}

    async def main():
        t0 = time.monotonic()
        async with trio.open_nursery() as n:
            (client,) = await start_nodes(n, [config(tmp_path, 0, gfile, model)])  # validator and client
            boot = client.host.addrs[0]
            for k, (s, e) in SERVERS.items():
                procs[k] = spawn(tmp_path, k, gfile, model.parent, "--span", f"{s}:{e}", "--bootstrap", boot,
                                 model="smollm2")
            await wait_serving(client, procs, timeout=300)
            times["start"] = time.monotonic() - t0
            prompt = client.encode_prompt(PROMPT)
            bal0 = client.ledger.state.account(client.ident.account).balance
            killed = []

            async def on_token(i, tok, route):
                if i == 17:
                    (dead,) = [p for p, s, e in route if (s, e) == MIDDLE]
                    killed.append(dead)
                    kill(procs[key_of[dead]])
                    await trio.to_thread.run_sync(wait_exit, procs[key_of[dead]])

            t1 = time.monotonic()
            gen = await client.generate(prompt, 48, on_token=on_token)
            times["generate"] = time.monotonic() - t1
            t2 = time.monotonic()
            recs = await wait_final(client, [r.id for r in gen.receipts], timeout=480)
            times["verdicts"] = time.monotonic() - t2
            paid = bal0 - client.ledger.state.account(client.ident.account).balance
            n.cancel_scope.cancel()
        return prompt, gen, killed, recs, paid

    try:
        try:
            prompt, gen, (dead,), recs, paid = trio.run(main)
        finally:
            stop_all(procs.values())
        print("phase times (s):", {k: round(v, 1) for k, v in times.items()})
        _check(model, procs, key_of, prompt, gen, dead, recs, paid)
    except BaseException:
        for k in SERVERS:  # what the servers logged: why one did not come up, serve or vote
            log = tmp_path / f"p{k}" / "stdout.log"
            if log.exists():
                lines = [x for x in log.read_text().splitlines() if not x.startswith("  ")]
                print(f"--- server {k} ---", *lines[-40:], sep="\n")
        raise


def _check(model, procs, key_of, prompt, gen, dead, recs, paid) -> None:
    assert gen.tokens == local_generate(model, prompt, 48)
    assert procs[key_of[dead]].returncode == -signal.SIGKILL
    (fo,) = gen.failovers
    assert fo.dead == dead and fo.token == 18 and fo.replayed == len(prompt) + 16
    assert len(gen.receipts) == 4
    mid = [r for r in gen.receipts if (r.span_start, r.span_end) == MIDDLE]
    dead_r, new_r = mid
    assert dead_r.worker == account_from_str(dead) and new_r.worker != dead_r.worker
    assert new_r.worker in {account_from_str(peer(k)) for k, span in SERVERS.items() if span == MIDDLE}
    assert dead_r.tokens == len(prompt) + 16  # the acknowledged steps: those that produced tokens 1..17
    assert new_r.tokens == 31  # tokens 18..48; the replayed prefix is unbilled
    full = len(prompt) + 47
    assert [r.tokens for r in gen.receipts if (r.span_start, r.span_end) != MIDDLE] == [full, full]
    # every receipt re-executed by its committee (other server processes, over libp2p) and accepted
    assert all(rec.status == VALID_S for rec in recs.values()), [(rec.status, rec.votes) for rec in recs.values()]
    servers = {account_from_str(peer(k)) for k in SERVERS}
    for rec in recs.values():  # the votes came from other server processes, and none of them disagreed
        voters = {v for v, _, _, _ in rec.votes}
        assert voters and voters <= servers - {rec.receipt.worker}, (voters, rec.receipt.worker)
        assert all(verdict == VALID for _, _, verdict, _ in rec.votes), rec.votes
    assert paid == sum(r.price for r in gen.receipts)  # each receipt paid once, the replay not at all
