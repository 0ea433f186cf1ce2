"""Collaborative training runs end to end on real nodes (libp2p on 127.0.0.1, LevelDB, torch, peft; tiny model):
four workers train a LoRA run DiLoCo-style, every sampled round receipt is replayed by a committee and every
aggregate is re-computed. Cheating workers over whole runs: test_run_cheats.py; a killed worker and a late
joiner, as processes: test_runs_processes.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.compute.model import make_tiny
from node.ledger.core.runs import RunStatus
from node.ledger.core.runstate import runs_of
from node.ledger.core.runtx import RunJoin
from node.ledger.core.state import FINAL
from node.training.client import post_run

from ..e2e.swarm import swarm, tiny_genesis

SPANS = [(0, 2), (2, 4), (4, 6), (0, 6)]  # four bonded servers: the run's workers (and each other's committees)
TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_bytes()
RUN = dict(trainable="lora", rank=4, targets="q_proj,v_proj", seed=3, lr_micro=10_000, batch_size=2, seq_len=16,
           inner_steps=6, inner_state="keep", screen_windows=2, rounds=2, min_workers=3, max_workers=4,
           outer_lr_ppm=1_000_000, outer_momentum_ppm=0, nesterov=1, clip_ppm=2_000_000, codec="int8", topk_ppm=0,
           price_per_step=10_000_000, aggregator_fee=10_000_000, sample_ppm=0, round_timeout=150)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def genesis():
    # sampling floor 40 %: p·S > (1 − p)·G holds with S = 100, G = 50 credits; a run raises it with sample_ppm.
    # Blocks every 0.4 s: four followers in one process on 2 cores fell ~500 blocks behind a 0.15 s validator
    # in 4 minutes (measured), and a worker acts on the phases its own ledger shows
    return tiny_genesis(4, sample_base_ppm=400_000, sample_floor_ppm=400_000, block_time_ms=400)


async def wait_run(node, run_id, statuses, timeout=540):
    with trio.fail_after(timeout):
        while True:
            run = runs_of(node.ledger.state).get(run_id)
            if run is not None and run.status in statuses and (
                    run.status != RunStatus.FINISHED or all(node.ledger.state.receipts[r].status in FINAL
                                                            for r in run.receipts)):
                return run
            await node.ledger.new_block.wait()


async def _run(tmp_path, tiny, settings, faults=None):
    g = genesis()
    async with swarm(tmp_path, tiny, SPANS, genesis=g, faults=faults) as nodes:
        sponsor = nodes[0]
        # workers fetch Δs and θ from each other and replay each other's receipts: connect them all (loopback
        # nodes keep only the connections they are given, so the swarm's star would make every fetch a new dial)
        for i, nd in enumerate(nodes):
            for other in nodes[i + 1:]:
                await nd.host.connect(other.host.addrs)
        supply = sponsor.ledger.state.supply()
        post = await post_run(sponsor, title="tiny", text=TEXT, settings=settings, deadline_blocks=20_000)
        for nd in nodes[1:]:
            me = nd.ident.account
            with trio.fail_after(30):
                while post.run_id not in runs_of(nd.ledger.state):
                    await nd.ledger.new_block.wait()
            await nd.ledger.submit(RunJoin(g.domain, me, post.run_id, nd.ledger.next_nonce(me)).signed(nd.ident))
        run = await wait_run(sponsor, post.run_id, {RunStatus.FINISHED, RunStatus.EXPIRED})
        for nd in nodes[1:]:  # followers apply the same blocks a little later
            await wait_run(nd, post.run_id, {RunStatus.FINISHED, RunStatus.EXPIRED}, timeout=120)
        st = sponsor.ledger.state.detach()  # read after the nodes closed their stores
        views = [runs_of(nd.ledger.state)[post.run_id].params for nd in nodes]
        verified = {nd.ident.account: set(nd.runs.cache.verified) for nd in nodes[1:]}
        return post, run, st, supply, views, verified, nodes


@pytest.mark.slow  # about 4 minutes on 2 cores: five nodes in one process, two rounds, every aggregate replayed
def test_four_workers_train_a_run_and_every_contribution_is_paid_once(tmp_path, tiny):
    post, run, st, supply, views, verified, nodes = trio.run(_run, tmp_path, tiny, RUN)
    assert run.status == RunStatus.FINISHED and run.round == post.rounds
    assert st.supply() == supply  # balances + bonds + escrows = genesis supply
    assert len(set(views)) == 1  # every node holds the same θ id
    workers = {nd.ident.account for nd in nodes[1:]}
    for h in run.history:
        # every honest commitment that was revealed was accepted: nobody was screened out or voted invalid; a
        # worker may only miss a phase (slow on a loaded machine: "not committed" / "not revealed")
        assert all(why in ("not committed", "not revealed") for _, why in h.excluded), h.excluded
        assert len(h.accepted) >= 3 and h.loss_ppm > 0 and h.delta_bytes > 0
    assert workers == set().union(*(set(h.accepted) for h in run.history))  # all four contributed
    # θ_1 was re-computed by every worker that trained round 1 before it trained (the aggregate's id, bit for bit)
    assert all(run.history[0].params_next in verified[w] for w in run.history[1].accepted)
    # each accepted receipt was paid exactly once: price less the committee fee when it was replayed
    fee = post.receipt_price * nodes[0].genesis.params.committee_fee_bps // 10_000
    paid = 0
    for h in run.history:
        rids = {w: rid for w, rid, _ in h.commits}
        for w in h.accepted:
            rec = st.receipts[rids[w]]
            assert rec.status in ("valid", "settled"), rec.status
            paid += post.receipt_price - (fee if rec.status == "valid" else 0)
    assert run.paid_workers == paid
    assert run.escrow_left == 0 and st.account(post.sender).escrow == 0
    # every aggregate was re-computed by a committee and found valid
    aggs = [st.receipts[h.aggregate] for h in run.history]
    assert all(a.status == "valid" and len(a.committee) == 2 for a in aggs)
    # each claimed θ_{r+1}'s held-out loss, and its committee re-measured the claim (node.training.heldout)
    held = [a.receipt.heldout_ppm for a in aggs]
    assert all(x > 0 for x in held), held


# Check 4 (a worker killed mid-round, a late joiner) runs as separate `node start` processes in
# test_runs_processes.py: with six nodes in this one trio loop, round 1 never opened within 400 s on 2 cores.


@pytest.mark.slow  # five nodes in one process, two rounds (~30 s on 2 cores)
def test_a_straggler_stalls_no_round_and_is_not_paid(tmp_path, tiny):
    """Issue 40, stragglers: one worker of four trains honestly but is ready three times as late as the fastest
    (``run-slow``). With quorum 2 every round closes on the faster ones (plus a tenth as long again; the quorum is
    2, not 3, because five nodes share one loop here and an honest worker is at times slower than 3x the fastest),
    the straggler's late work is never committed nor paid, and the run finishes without it."""
    settings = {**RUN, "min_workers": 2, "quorum": 2, "round_timeout": 600}  # 4 min: only a quorum closes a round
    post, run, st, supply, _views, _verified, nodes = trio.run(
        lambda: _run(tmp_path, tiny, settings, faults={3: "run-slow"}))
    slow = nodes[3]
    assert post.quorum == 2 and run.status == RunStatus.FINISHED and run.round == post.rounds
    assert st.supply() == supply
    assert all(len(h.commits) >= 2 and slow.ident.account not in {w for w, _, _ in h.commits} for h in run.history)
    assert all(slow.ident.account not in h.accepted for h in run.history)
    # it trained every round and was cut off each time: the commit phase had closed when its work was ready, or
    # closed before its receipt reached a block (then its Δ stays unserved). A round it was too slow for sets no
    # retry backoff: the next round is new work
    cut = [line for line in slow.runs.log if "commit phase closed while training" in line or "not served" in line]
    assert len(cut) == post.rounds, slow.runs.log
    assert not any(st.receipts[r].receipt.worker == slow.ident.account for r in run.receipts)  # nothing to pay
    assert not run.failed  # no attempt failed: every round closed on its quorum, not at round_timeout
