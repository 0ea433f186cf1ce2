"""Issue 16, check 4, on real nodes (libp2p on 127.0.0.1, LevelDB, torch with the tiny model): jobs cannot be held
hostage. A poster whose dataset cannot be fetched holds no worker: honest workers skip its job (they fetch before
they accept) and take a real job posted meanwhile within the start window; a bonded key that accepts the hostage
job and never trains holds it for exactly the start window and its bond pays the start penalty; a worker whose
training keeps failing gives its jobs back with ``job_release`` (once by itself, once through the API) for the
smaller penalty. Credits are conserved at every block."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx
import pytest
import trio

from node.compute.model import make_tiny
from node.identity import Identity, dev_seed
from node.ledger.core.jobstate import ACCEPTED, CANCELLED, OPEN, RELEASED, START_TIMEOUT, jobs_of
from node.ledger.core.jobtx import JobAccept, JobCancel, JobPost
from node.ledger.genesis import TREASURY, Genesis, Params
from node.market.client import job_json, post_job

from ..e2e.swarm import C, swarm

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_bytes()
JOB = dict(steps=4, segment_steps=2, batch_size=2, seq_len=16, lr=1e-2, rank=4, price_per_step=10**7)
KEYS = [Identity.from_seed(dev_seed(i)) for i in range(5)]
OFFLINE_REQUESTER, HOSTAGE_WORKER = KEYS[3], KEYS[4]  # funded / bonded keys that run no node


def genesis(window: int) -> Genesis:
    """dev0 validator and client; dev1, dev2 bonded servers; dev3 a funded requester and dev4 a bonded worker,
    neither of which runs a node."""
    p = Params(block_time_ms=150, price_per_token_block=100_000, max_receipt_price=50 * C, committee_size=2,
               verdict_timeout=600, job_start_window=window, job_start_penalty=3 * C, job_release_penalty=C)
    bal = [(KEYS[0].account, 1000 * C, 0), (KEYS[1].account, 100 * C, 200 * C), (KEYS[2].account, 100 * C, 200 * C),
           (OFFLINE_REQUESTER.account, 100 * C, 0), (HOSTAGE_WORKER.account, 0, 20 * C)]
    return Genesis("tally-test", 0, (KEYS[0].account,), tuple(bal), p)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


async def wait_for(node, pred, timeout: float = 60):
    """The first ledger state (checked at each new block) for which ``pred(state)`` is true."""
    with trio.fail_after(timeout):
        while not pred(node.ledger.state):
            await node.ledger.new_block.wait()
        return node.ledger.state


def unfetchable_post(domain: str, sender: Identity, model_id: bytes, height: int, nonce: int) -> JobPost:
    """A job whose dataset (a random content hash) nobody holds, signed for ``domain`` (``Genesis.domain``)."""
    return JobPost(domain, sender.account, os.urandom(16), "hostage", model_id, os.urandom(32), 4,
                   "q_proj,v_proj", 4, 2, 16, 10_000, 0, 2, 10**7, height + 2000, 0, nonce).signed(sender)


def test_unfetchable_jobs_hold_no_worker_and_the_hostage_holder_pays(tmp_path, tiny, caplog):
    window = 60
    g = genesis(window)

    async def main():
        async with swarm(tmp_path, tiny, [(0, 3), (3, 6)], genesis=g, accept_jobs={1, 2}) as nodes:
            client, workers = nodes[0], {nd.ident.account for nd in nodes[1:]}
            supplies, held_by = [], set()

            def watch(block, st):
                supplies.append(st.supply())
                held_by.update((jid, j.worker) for jid, j in jobs_of(st).items() if j.status == ACCEPTED)

            client.ledger.on_block(watch)
            mid = client.manifest.model_id
            st = client.ledger.state
            # two hostage posts: a requester that is offline, and a requester online without the blob
            h1 = unfetchable_post(g.domain, OFFLINE_REQUESTER, mid, st.height, 0)
            h2 = unfetchable_post(g.domain, KEYS[0], mid, st.height, client.ledger.next_nonce(KEYS[0].account))
            await client.ledger.submit(h1)
            await client.ledger.submit(h2)
            await wait_for(client, lambda s: h1.job_id in jobs_of(s) and h2.job_id in jobs_of(s))
            # a bonded key accepts h1 and will never train it
            await client.ledger.submit(JobAccept(g.domain, HOSTAGE_WORKER.account, h1.job_id, 0)
                                       .signed(HOSTAGE_WORKER))
            s = await wait_for(client, lambda s: jobs_of(s)[h1.job_id].status == ACCEPTED)
            hostage_at = jobs_of(s)[h1.job_id].accepted_height
            # meanwhile a real job
            real = await post_job(client, title="real", text=TEXT, seed=3, **JOB)
            s = await wait_for(client, lambda s: real.job_id in jobs_of(s))
            posted_at = jobs_of(s)[real.job_id].height
            s = await wait_for(client, lambda s: jobs_of(s)[real.job_id].status == ACCEPTED, timeout=window * 0.15 + 30)
            real_accepted = jobs_of(s)[real.job_id]
            s = await wait_for(client, lambda s: jobs_of(s)[real.job_id].segments, timeout=window * 0.15 + 30)
            real_started_at = s.height
            s = await wait_for(client, lambda s: jobs_of(s)[h1.job_id].status == OPEN)
            reopened = jobs_of(s)[h1.job_id]
            s = await wait_for(client, lambda s: s.height >= reopened.dropped[0][2] + 20)  # a few more blocks
            skipped = {nd.ident.account: dict(nd.jobs.skipped) for nd in nodes[1:]}
            return (s.detach(), hostage_at, posted_at, real_accepted, real_started_at, reopened, supplies, held_by,
                    workers, skipped, job_json(jobs_of(s)[h1.job_id], s))

    with caplog.at_level(logging.INFO, logger="tally.market"):
        s, hostage_at, posted_at, real_acc, real_started_at, reopened, supplies, held_by, workers, skipped, h1_json = \
            trio.run(main)
    h1_id = reopened.post.job_id
    h2_id = next(j for j in jobs_of(s) if j not in (h1_id, real_acc.post.job_id))
    p = g.params
    # no honest worker ever held a hostage job; the real job posted meanwhile was accepted within the window
    assert not {(h1_id, w) for w in workers} & held_by and not {(h2_id, w) for w in workers} & held_by
    assert jobs_of(s)[h2_id].status == OPEN and jobs_of(s)[h2_id].dropped == ()
    assert real_acc.worker in workers and real_acc.accepted_height - posted_at <= p.job_start_window
    assert real_started_at <= real_acc.accepted_height + p.job_start_window  # and started in its own window
    # the hostage holder held h1 for exactly the start window, then paid the start penalty from its bond
    assert reopened.dropped == ((HOSTAGE_WORKER.account, START_TIMEOUT, hostage_at + window, p.job_start_penalty),)
    assert jobs_of(s)[h1_id].status == OPEN and jobs_of(s)[h1_id].worker == b""  # and honest workers still skip it
    assert s.account(HOSTAGE_WORKER.account).bond == 20 * C - p.job_start_penalty
    assert s.account(TREASURY).balance == p.job_start_penalty  # the treasury holds nothing else on this chain
    assert s.account(real_acc.worker).bond == 200 * C  # the honest worker paid nothing
    assert h1_json["dropped"][0]["reason"] == START_TIMEOUT and h1_json["start_by"] is None
    # the idle worker (the other one is busy with the real job: at capacity it looks at no other job) kept trying
    # both unfetchable datasets, h1 again after it reopened, with backoff, and said so once per job
    (idle,) = workers - {real_acc.worker}
    assert skipped[idle].get(h2_id, (0,))[0] >= 2 and skipped[idle].get(h1_id, (0,))[0] >= 1, skipped
    said = [r for r in caplog.records if r.levelno >= logging.INFO and "skipping job" in r.getMessage()]
    assert 1 <= sum(h1_id.hex()[:12] in r.getMessage() for r in said) <= len(workers)
    assert 1 <= sum(h2_id.hex()[:12] in r.getMessage() for r in said) <= len(workers)
    # credits conserved at every block
    assert supplies and set(supplies) == {g.supply}


def test_a_worker_that_cannot_train_releases_its_jobs_for_the_smaller_penalty(tmp_path, tiny):
    """Worker dev1 holds two jobs at once (``job_capacity`` 2); its training fails on every attempt (its torch
    device does not exist). One job it gives back through the API at once, the other by itself after
    ``RELEASE_AFTER`` failures; both before the start window, each for ``job_release_penalty``."""
    from node.market.worker import RELEASE_AFTER, backoff

    window = 200  # 30 s: longer than the worker's retries before it releases (2 + 4 s and block granularity)
    assert sum(backoff(n) for n in range(1, RELEASE_AFTER)) < window * 0.15 / 2
    g = genesis(window)

    async def main():
        async with swarm(tmp_path, tiny, [(0, 6)], genesis=g, accept_jobs={1}) as nodes:
            client, worker = nodes
            worker.jobs.capacity = 2
            worker.jobs.device = "cuda:99"  # every Trainer fails: no such device
            supplies = []
            client.ledger.on_block(lambda block, st: supplies.append(st.supply()))
            a = await post_job(client, title="a", text=TEXT, seed=1, **JOB)
            b = await post_job(client, title="b", text=TEXT[::-1], seed=2, **JOB)
            s = await wait_for(client, lambda s: all(
                jobs_of(s).get(j.job_id) and jobs_of(s)[j.job_id].status == ACCEPTED for j in (a, b)))
            held_at_once = {jobs_of(s)[j.job_id].worker for j in (a, b)}
            accepted_at = {j.job_id: jobs_of(s)[j.job_id].accepted_height for j in (a, b)}
            st_w = await wait_for(worker, lambda s: all(
                j.job_id in jobs_of(s) and jobs_of(s)[j.job_id].status == ACCEPTED for j in (a, b)))
            assert jobs_of(st_w)[a.job_id].worker == worker.ident.account
            url, token = worker.api_url, worker.api_token

            def api_release(jid):
                return httpx.post(f"{url}/v1/jobs/{jid.hex()}/release", headers={"Authorization": f"Bearer {token}"})

            r = await trio.to_thread.run_sync(api_release, a.job_id)
            bad = await trio.to_thread.run_sync(lambda: httpx.post(f"{client.api_url}/v1/jobs/{b.job_id.hex()}/release",
                                                                  headers={"Authorization":
                                                                           f"Bearer {client.api_token}"}))
            s = await wait_for(client, lambda s: all(jobs_of(s)[j.job_id].status == OPEN for j in (a, b)), timeout=60)
            dropped = {j.job_id: jobs_of(s)[j.job_id].dropped for j in (a, b)}
            # back to open, the requester cancels both and gets the whole escrow back
            n = client.ledger.next_nonce(client.ident.account)
            for i, j in enumerate((a, b)):
                await client.ledger.submit(JobCancel(g.domain, client.ident.account, j.job_id, n + i)
                                           .signed(client.ident))
            s = await wait_for(client, lambda s: all(jobs_of(s)[j.job_id].status == CANCELLED for j in (a, b)))
            return s, held_at_once, accepted_at, r, bad, dropped, supplies, worker.ident.account

    s, held_at_once, accepted_at, r, bad, dropped, supplies, w = trio.run(main)
    p = g.params
    assert held_at_once == {w}  # one worker held both jobs at once: its capacity is 2
    assert r.status_code == 200, r.text
    assert bad.status_code == 403 and bad.json()["code"] == "not_yours"  # only the holder may release
    for jid, d in dropped.items():
        assert len(d) == 1 and d[0][0] == w and d[0][1] == RELEASED and d[0][3] == p.job_release_penalty
        assert d[0][2] < accepted_at[jid] + p.job_start_window  # released before the window ran out
    assert s.account(w).bond == 200 * C - 2 * p.job_release_penalty
    assert s.account(TREASURY).balance == 2 * p.job_release_penalty
    assert s.account(KEYS[0].account).balance == 1000 * C and s.account(KEYS[0].account).escrow == 0
    assert supplies and set(supplies) == {g.supply}
