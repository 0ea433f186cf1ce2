"""The aggregate's committee check (node.training.replay.check_aggregate) with a held-out loss claim, on the tiny
model with real torch and a real blob store: one round of a run trained by four workers on the pure ledger state,
then the member re-computes the aggregate from the blobs and re-measures θ_{r+1}'s held-out loss. The honest
claim is valid; a claim 0.005 nats/token better than measured, or θ_r's loss claimed for θ_{r+1}, is invalid."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import trio

from node.blobs import BlobStore
from node.compute.data import dataset_tensors
from node.compute.model import make_tiny
from node.encoding import commitments_root
from node.ledger.core.runs import Phase
from node.ledger.core.runtx import NO_MOMENTUM, RoundAggregate, RoundReceipt, RoundReveal, RunJoin, RunPost
from node.ledger.core.tx import INVALID, VALID
from node.training import rounds as rd
from node.training.assign import batch_tensors, screen_tensor
from node.training.heldout import heldout_loss_ppm, heldout_windows
from node.training.replay import check_aggregate
from node.training.worker import RunCache

from ..ledger.test_runs import BY_ACCOUNT, SPONSOR, WORKERS, Chain

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_bytes()


class _Executor:
    async def run(self, fn, *args):
        return fn(*args)


class _NoNetwork:
    async def request(self, *_a, **_k):  # every tensor is in the local blob store: nothing is fetched
        raise AssertionError("the check asked the network for a blob this test stored locally")


@dataclasses.dataclass
class _Member:
    ledger: object
    host: object
    blobs: BlobStore
    executor: object
    model: Path

    async def model_dir_for(self, model_id, holders):
        return self.model


@pytest.fixture(scope="module")
def round_at_aggregate(tmp_path_factory):
    """A run whose round 0 was committed and revealed by four honest workers (tiny model, LoRA, int8), at its
    aggregate phase; returns (chain, member, the honest aggregate, θ_r, its held-out loss)."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("check")
    model = make_tiny(tmp / "models", seed=0)
    blobs = BlobStore(tmp / "data")
    c = Chain()
    f = dict(title="held", model_id=b"m" * 32, dataset_root=blobs.put(dataset_tensors(TEXT)), trainable="lora",
             rank=4, targets="q_proj,v_proj", seed=3, lr_micro=10_000, batch_size=2, seq_len=16, inner_steps=3,
             inner_state="reset", screen_windows=2, rounds=2, min_workers=3, max_workers=4, outer_lr_ppm=1_000_000,
             outer_momentum_ppm=0, nesterov=1, clip_ppm=2_000_000, codec="int8", topk_ppm=0,
             price_per_step=10_000_000, aggregator_fee=20_000_000, sample_ppm=0, round_timeout=5, deadline=500)
    trainer = rd.make_trainer(model, f)
    theta = trainer.params()
    f["params0"] = blobs.put(theta)
    post = RunPost(c.g.domain, SPONSOR.account, b"h" * 16, nonce=c.nonce(SPONSOR), **f).signed(SPONSOR)
    c.block(post)
    c.block(*[RunJoin(c.g.domain, w.account, post.run_id, c.nonce(w)).signed(w) for w in WORKERS])
    run = c.run(post)
    cur = run.cur
    windows = rd.run_windows(model, post, TEXT)
    receipts, payloads, screens = [], {}, {}
    for w in cur.participants:
        a = rd.assignment(post, cur.beacon, cur.round, cur.participants, windows.shape[0], w)
        batches = batch_tensors(windows, a)
        opt_before = rd.expected_opt_before(trainer, post, None)
        work = rd.train_round(trainer, post, theta, opt_before, batches, None, None, None, None)
        payloads[w], screens[w] = work.payload, screen_tensor(windows, a)
        receipts.append(RoundReceipt(c.g.domain, post.run_id, 0, 0, w, SPONSOR.account, run.params,
                                     commitments_root(opt_before), commitments_root(work.params_after),
                                     commitments_root(work.opt_after), commitments_root(batches),
                                     blobs.put(work.payload), work.delta_bytes, work.loss_ppm, post.inner_steps,
                                     post.receipt_price).signed(BY_ACCOUNT[w]))
    c.block(*receipts)
    c.block(*[RoundReveal(c.g.domain, post.run_id, 0, 0, r.worker, r.delta_root).signed(BY_ACCOUNT[r.worker])
              for r in receipts])
    for _ in range(3):  # unsampled at sample_ppm 0 and the genesis floor: the aggregate phase needs no votes
        if c.run(post).cur.phase == Phase.AGGREGATE:
            break
        c.block()
    cur = c.run(post).cur
    assert cur.phase == Phase.AGGREGATE
    res, excluded = rd.aggregate_round(trainer, post, theta, None, payloads, screens)
    assert not excluded
    held = heldout_windows(model, post, TEXT)
    claim = heldout_loss_ppm(trainer, res.params, held)
    agg = BY_ACCOUNT[cur.aggregator]
    mom_id = NO_MOMENTUM if res.momentum is None else blobs.put(res.momentum)
    honest = RoundAggregate(c.g.domain, post.run_id, 0, 0, agg.account, SPONSOR.account, run.params, NO_MOMENTUM,
                            blobs.put(res.params), mom_id, tuple(sorted(res.accepted)), post.aggregator_fee,
                            heldout_ppm=claim).signed(agg)
    member = _Member(type("Ledger", (), {"state": c.s})(), _NoNetwork(), blobs, _Executor(), model)
    return member, honest, heldout_loss_ppm(trainer, theta, held)


def _check(member, a):
    return trio.run(check_aggregate, member, a, RunCache())


@pytest.mark.slow  # ~5 s: four workers train a round of the tiny model, then the check re-computes it four times
def test_the_honest_claim_is_valid_and_a_false_one_invalid(round_at_aggregate):
    member, honest, before = round_at_aggregate
    assert honest.heldout_ppm > 0 and abs(honest.heldout_ppm - before) > 1_000  # the round moved the loss
    assert _check(member, honest).verdict == VALID
    agg = BY_ACCOUNT[honest.aggregator]
    better = dataclasses.replace(honest, heldout_ppm=honest.heldout_ppm - 5_000, sig=b"").signed(agg)
    assert _check(member, better).verdict == INVALID  # a made-up improvement
    stale = dataclasses.replace(honest, heldout_ppm=before, sig=b"").signed(agg)
    assert _check(member, stale).verdict == INVALID  # θ_r's loss claimed for θ_{r+1}
    none = dataclasses.replace(honest, heldout_ppm=0, sig=b"").signed(agg)
    assert _check(member, none).verdict == VALID  # no claim: the field is optional
