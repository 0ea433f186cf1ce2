"""A round of a run in torch on the tiny model: honest workers replay VALID; every cheat kind of the issue is
caught by the committee's replay, and the ones that damage the model are also excluded by the screen before the
outer step. Four workers, one cheater, real InnerTrainer / assign / codec / outer (no network: the same
functions the node's services call)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.compute.model import make_tiny
from node.encoding import H, commitments_root
from node.ledger.core.runtx import RunPost
from node.ledger.core.tx import INVALID, VALID
from node.training import rounds as rd
from node.training.assign import batch_tensors, screen_tensor

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_bytes()
WORKERS = [bytes([i]) * 32 for i in (1, 2, 3, 4)]
RUN_ID = b"r" * 16  # fixed: the batches drawn depend on it (3 other ids passed too)
CHEATS = ["run-zero", "run-scale", "run-flip", "run-nan", "run-fewer", "run-otherdata", "run-stale", "run-replay"]
# excluded before the outer step on the tiny random model: NaN (non-finite). Its screen is weak this early (a x100
# Δ *lowered* one screen loss from 8.62 to 6.82, a flipped one raised it by only 0.02 nats, and honest Δs moved it
# by -0.21..+0.06), so the replay is what catches those; a x100 Δ is also clipped to clip_mult × the median norm
SCREENED = {"run-nan"}


def post(**kw) -> RunPost:
    f = dict(title="t", model_id=b"m" * 32, dataset_root=b"d" * 32, trainable="lora", rank=4,
             targets="q_proj,v_proj", seed=3, params0=b"\x01" * 32, lr_micro=10_000, batch_size=2, seq_len=16,
             inner_steps=4, inner_state="keep", screen_windows=2, rounds=3, min_workers=3, max_workers=4,
             outer_lr_ppm=1_000_000, outer_momentum_ppm=0, nesterov=1, clip_ppm=2_000_000, codec="int8",
             topk_ppm=0, price_per_step=1, aggregator_fee=1, sample_ppm=0, round_timeout=10, deadline=100)
    f.update(kw)
    return RunPost("tally-test", b"s" * 32, RUN_ID, nonce=0, **f)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.set_num_threads(1)
    model = make_tiny(tmp_path_factory.mktemp("models"), seed=0)
    p = post()
    trainer = rd.make_trainer(model, p)
    windows = rd.run_windows(model, p, TEXT)
    return model, p, trainer, windows


def play_round(world, beacon, theta, fault=None, history=None):
    """Every worker trains one round from ``theta``; worker 3 (index 2) cheats with ``fault``. Returns the
    per-worker (opt_before, work, assignment) and the batches."""
    _model, p, trainer, windows = world
    history = history or {}
    out = {}
    for i, w in enumerate(WORKERS):
        a = rd.assignment(p, beacon, 1, WORKERS, windows.shape[0], w)
        batches = batch_tensors(windows, a)
        prev = history.get(w, {}).get("opt_after")
        opt_before = rd.expected_opt_before(trainer, p, prev)
        f = fault if i == 2 else None
        other = batch_tensors(windows, rd.assignment(p, bytes(32), 1, WORKERS, windows.shape[0], w))
        work = rd.train_round(trainer, p, theta, opt_before, batches, f, history.get(w, {}).get("theta"),
                              history.get(w, {}).get("payload"), other)
        out[w] = dict(opt_before=opt_before, work=work, a=a, batches=batches, prev=prev)
    return out


def replay(world, theta, r):
    _model, p, trainer, _windows = world
    expected = rd.expected_opt_before(trainer, p, r["prev"])
    w = r["work"]
    return rd.replay_round(trainer, p, theta, r["opt_before"], expected, r["batches"], commitments_root(r["batches"]),
                           w.params_after, w.opt_after, w.payload, w.delta_bytes)


@pytest.fixture(scope="module")
def round0(world):
    """An honest round 0 (its θ, Δs and states are the history that the stale and replay cheats reuse)."""
    _model, p, trainer, windows = world
    theta0 = trainer.params()
    played = play_round(world, H(b"beacon0"), theta0)
    res, excluded = rd.aggregate_round(trainer, p, theta0, None, {w: r["work"].payload for w, r in played.items()},
                                       {w: screen_tensor(windows, r["a"]) for w, r in played.items()})
    history = {w: dict(opt_after=r["work"].opt_after, theta=theta0, payload=r["work"].payload)
               for w, r in played.items()}
    return theta0, played, res, excluded, history


def test_honest_round_replays_valid_passes_the_screen_and_lowers_the_loss(world, round0):
    _model, p, trainer, windows = world
    theta0, played, res, excluded, _ = round0
    assert not excluded and res.accepted == tuple(WORKERS)
    for _w, r in played.items():
        verdict, d, why = replay(world, theta0, r)
        assert verdict == VALID and d <= rd.ROUND_TOLERANCE, why
    held = windows[-64:]
    trainer.load_params(theta0)
    before = trainer.eval_loss(held)
    trainer.load_params(res.params)
    assert trainer.eval_loss(held) < before  # the outer step moved θ toward the workers and helped
    # the aggregate re-computes bit for bit from the accepted Δs (what committees and workers check)
    again = rd.recompute_outer(trainer, p, theta0, None, {w: r["work"].payload for w, r in played.items()})
    assert commitments_root(again.params) == commitments_root(res.params)


@pytest.mark.parametrize("fault", CHEATS)
def test_each_cheat_is_caught_by_replay_and_damaging_ones_by_the_screen(world, round0, fault):
    _model, p, trainer, windows = world
    _theta0, _, res0, _, history = round0
    theta1 = res0.params
    played = play_round(world, H(b"beacon1"), theta1, fault=fault, history=history)
    cheat = WORKERS[2]
    for w, r in played.items():
        verdict, d, why = replay(world, theta1, r)
        if w == cheat:
            assert verdict == INVALID, (fault, d, why)  # slashed when sampled
        else:
            assert verdict == VALID, (w, d, why)
    honest_only = rd.recompute_outer(trainer, p, theta1, None,
                                     {w: r["work"].payload for w, r in played.items() if w != cheat})
    res, excluded = rd.aggregate_round(trainer, p, theta1, None, {w: r["work"].payload for w, r in played.items()},
                                       {w: screen_tensor(windows, r["a"]) for w, r in played.items()})
    if fault in SCREENED:
        assert cheat in excluded and cheat not in res.accepted, excluded
        assert commitments_root(res.params) == commitments_root(honest_only.params)
    assert set(res.accepted) >= set(WORKERS) - {cheat}, excluded  # no honest worker is screened out
    if fault == "run-scale":  # screened out, or clipped to 2 × the median norm (which one depends on the data)
        assert cheat in excluded or res.scales[cheat] < 0.1, (excluded, res.scales)
    # whatever got through, the model stays within 1 % of the honest-only outer step's held-out loss
    held = windows[-64:]
    trainer.load_params(honest_only.params)
    ref = trainer.eval_loss(held)
    trainer.load_params(res.params)
    assert trainer.eval_loss(held) <= ref * 1.01


# ------------------------------------------------------------------ a topk-int4 run: the codec and the residual
# (issue 40, check 3). Round 1, after an honest round 0, so that every worker carries a non-zero residual. Each
# cheat is caught by one named check of replay_round (the reason is asserted, so disabling that check fails it).

INT4 = dict(codec="topk-int4", topk_ppm=50_000)
WRONG_DELTA = "the committed Δ is not θ_r − θ_worker encoded with the run's codec"
WRONG_START = "opt_before is not the state this worker had to start from"
WRONG_RESIDUAL = "the committed codec residual is not the encoding's"


@pytest.fixture(scope="module")
def int4_round0(world):
    """An honest round 0 of a topk-int4 run: the world, θ_1 and each worker's history (opt_after, θ, payload)."""
    model, _p, trainer, windows = world
    w4 = (model, post(**INT4), trainer, windows)
    theta0 = trainer.params()
    played = play_round(w4, H(b"beacon0"), theta0)
    res, excluded = rd.aggregate_round(trainer, w4[1], theta0, None, {w: r["work"].payload for w, r in played.items()},
                                       {})
    assert not excluded
    n = len(trainer.names)
    for r in played.values():  # what error feedback carries into round 1 is really there
        assert any(float(t.abs().max()) > 0 for t in r["work"].opt_after[2 * n:3 * n])
    return w4, res.params, {w: dict(opt_after=r["work"].opt_after, theta=theta0, payload=r["work"].payload)
                            for w, r in played.items()}


def _int4_round1(int4_round0, worker, fault=None, opt_before=None):
    """``worker`` trains round 1 of the topk-int4 run (with ``fault``, or from ``opt_before``): its replay input."""
    w4, theta1, history = int4_round0
    _model, p, trainer, windows = w4
    a = rd.assignment(p, H(b"beacon1"), 1, WORKERS, windows.shape[0], worker)
    batches = batch_tensors(windows, a)
    prev = history[worker]["opt_after"]
    if opt_before is None:
        opt_before = rd.expected_opt_before(trainer, p, prev)
    work = rd.train_round(trainer, p, theta1, opt_before, batches, fault)
    return dict(opt_before=opt_before, work=work, a=a, batches=batches, prev=prev)


def _residual_of(trainer, opt):
    n = len(trainer.names)
    return opt[2 * n:3 * n]


def _with_residual(trainer, opt, residual):
    n = len(trainer.names)
    return opt[:2 * n] + [t.clone() for t in residual] + opt[3 * n:]


def test_an_honest_topk_int4_round_replays_valid(int4_round0):
    w4, theta1, _ = int4_round0
    for w in (WORKERS[0], WORKERS[2]):
        verdict, d, why = replay(w4, theta1, _int4_round1(int4_round0, w))
        assert verdict == VALID and d <= rd.ROUND_TOLERANCE, why


def test_a_delta_in_another_codec_than_the_runs_is_invalid_and_not_aggregated(int4_round0):
    """run-codec: full-precision top-k values instead of the run's 4-bit ones, everything else honest (its
    committed residual is the run codec's): only the Δ check can catch it, and the aggregator refuses the Δ."""
    w4, theta1, _ = int4_round0
    _model, p, trainer, _windows = w4
    r = _int4_round1(int4_round0, WORKERS[2], "run-codec")
    honest = _int4_round1(int4_round0, WORKERS[2])
    assert len(r["work"].payload) == 2 * len(trainer.names) and r["work"].delta_bytes > honest["work"].delta_bytes
    assert all(torch.equal(a, b) for a, b in zip(r["work"].opt_after, honest["work"].opt_after, strict=True))
    assert replay(w4, theta1, r) == (INVALID, pytest.approx(0.0, abs=rd.ROUND_TOLERANCE), WRONG_DELTA)
    res, excluded = rd.aggregate_round(trainer, p, theta1, None, {WORKERS[0]: honest["work"].payload,
                                                                  WORKERS[2]: r["work"].payload}, {})
    assert excluded[WORKERS[2]].startswith("malformed Δ") and res.accepted == (WORKERS[0],)


def test_a_delta_encoded_from_another_residual_than_committed_is_invalid(int4_round0):
    """run-residual: opt_before commits the carried residual r, but Δ is encoded from r + Δ (and the residual that
    leaves is committed in opt_after): the replay re-encodes from opt_before's r and the Δ differs."""
    w4, theta1, _ = int4_round0
    r = _int4_round1(int4_round0, WORKERS[2], "run-residual")
    honest = _int4_round1(int4_round0, WORKERS[2])
    assert all(torch.equal(a, b) for a, b in zip(r["opt_before"], honest["opt_before"], strict=True))
    assert replay(w4, theta1, r)[::2] == (INVALID, WRONG_DELTA)


def test_a_carried_residual_other_than_the_one_committed_last_round_is_invalid(int4_round0):
    """A worker that starts round 1 from another residual than its round-0 opt_after committed (here: none, as
    after a restart that lost it), and is honest from there on: its opt_before is not the state it had to start
    from."""
    w4, theta1, history = int4_round0
    trainer = w4[2]
    expected = rd.expected_opt_before(trainer, w4[1], history[WORKERS[2]]["opt_after"])
    dropped = _with_residual(trainer, expected, [torch.zeros_like(t) for t in _residual_of(trainer, expected)])
    r = _int4_round1(int4_round0, WORKERS[2], opt_before=dropped)
    assert replay(w4, theta1, r)[::2] == (INVALID, WRONG_START)


def test_a_committed_residual_other_than_the_encodings_is_invalid(int4_round0):
    """A worker that sends the honest Δ but commits a residual other than the one its encoding left (zero: it
    would enter round 2 without the error it owes): the replay's encoding leaves another residual."""
    w4, theta1, _ = int4_round0
    trainer = w4[2]
    r = _int4_round1(int4_round0, WORKERS[2])
    after = r["work"].opt_after
    r["work"].opt_after = _with_residual(trainer, after, [torch.zeros_like(t) for t in _residual_of(trainer, after)])
    assert replay(w4, theta1, r)[::2] == (INVALID, WRONG_RESIDUAL)
