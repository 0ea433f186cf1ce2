"""InnerTrainer: the tensor-list state of a worker round round-trips bit for bit, reset zeroes the moments, and
both LoRA and all-parameter runs train (tiny random Llama; one torch thread for bit-identity)."""

from __future__ import annotations

import pytest
import torch

from node.compute.model import make_tiny
from node.compute.train import Trainer, TrainSpec
from node.training.inner import InnerTrainer, make_scratch_model

TARGETS = ("q_proj", "v_proj")
TEXT = b"the quick brown fox jumps over the lazy dog. " * 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def windows(n: int, seq_len: int = 16, offset: int = 0, vocab: int = 320) -> torch.Tensor:
    ids = torch.tensor(list(TEXT), dtype=torch.long) % vocab
    L = seq_len + 1
    return torch.stack([ids[offset + i * L: offset + (i + 1) * L] for i in range(n)])


def batches(k: int, start: int = 0) -> list[torch.Tensor]:
    return [windows(2, offset=(start + i) * 5) for i in range(k)]


def make(tiny, trainable="lora", lr=1e-2, seed=7):
    return InnerTrainer(tiny, trainable, 4, TARGETS, lr, seed)


def test_lora_init_is_the_trainers(tiny):
    tr = make(tiny)
    ref = Trainer(tiny, TrainSpec(rank=4, targets=TARGETS, steps=1, batch_size=1, seq_len=8, lr=1e-2, seed=7,
                                  segment_steps=1))
    assert tr.names == ref.names and all("lora_" in n for n in tr.names)
    for a, b in zip(tr.params(), ref.params, strict=True):
        assert torch.equal(a, b.detach())
    assert all(torch.count_nonzero(p) == 0 for n, p in zip(tr.names, tr.params(), strict=True) if "lora_B" in n)
    st = tr.opt_state()
    n = len(tr.names)
    assert len(st) == 3 * n + 1 and st[-1].dtype == torch.int64 and st[-1].tolist() == [0]
    assert all(torch.count_nonzero(t) == 0 for t in st[:-1])


@pytest.mark.parametrize("trainable", ["lora", "all"])
def test_state_round_trip_reproduces_training_bit_for_bit(tiny, trainable):
    a = make(tiny, trainable)
    a.train(batches(3))
    theta, opt = a.params(), a.opt_state()
    assert opt[-1].tolist() == [3]
    assert any(torch.count_nonzero(t) > 0 for t in opt[:2 * len(a.names)])
    res = [torch.full(p.shape, 0.5) for p in theta]
    a.set_residuals(res)
    opt = a.opt_state()
    losses_a = a.train(batches(2, start=3))
    after_a, opt_a = a.params(), a.opt_state()

    b = make(tiny, trainable, seed=99)  # a different LoRA init: everything must come from the loaded tensors
    b.train(batches(1, start=10))  # and stale moments, overwritten by the load
    b.load_params(theta)
    b.load_opt_state(opt)
    losses_b = b.train(batches(2, start=3))
    assert losses_a == losses_b
    for x, y in zip(after_a, b.params(), strict=True):
        assert torch.equal(x, y)
    for x, y in zip(opt_a, b.opt_state(), strict=True):
        assert torch.equal(x, y)
    assert opt_a[-1].tolist() == [5]
    n = len(a.names)
    # training leaves the residual alone
    assert all(torch.equal(r, x) for r, x in zip(res, opt_a[2 * n:3 * n], strict=True))


def test_reset_zeroes_moments_and_step_keeps_residual(tiny):
    tr = make(tiny)
    tr.train(batches(2))
    res = [torch.full(s, 0.25) for s in tr.shapes]
    tr.set_residuals(res)
    tr.reset_opt_state()
    st = tr.opt_state()
    n = len(tr.names)
    assert all(torch.count_nonzero(t) == 0 for t in st[:2 * n])
    assert all(torch.equal(r, t) for r, t in zip(res, st[2 * n:3 * n], strict=True))
    assert st[-1].tolist() == [0]
    # a reset trainer steps exactly like a fresh one loaded with the same θ
    theta = tr.params()
    fresh = make(tiny)
    fresh.load_params(theta)
    assert tr.train(batches(1, start=4)) == fresh.train(batches(1, start=4))
    for x, y in zip(tr.params(), fresh.params(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("trainable,lr", [("lora", 2e-2), ("all", 3e-3)])
def test_loss_falls_on_repeated_text(tiny, trainable, lr):
    tr = make(tiny, trainable, lr=lr)
    held = windows(4, offset=3)
    before = tr.eval_loss(held)
    theta0 = tr.params()
    losses = tr.train([windows(4)] * 12)
    after = tr.eval_loss(held)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.3
    assert after < before - 0.3
    changed = [not torch.equal(a, b) for a, b in zip(theta0, tr.params(), strict=True)]
    assert all(changed) if trainable == "lora" else sum(changed) >= len(changed) - 1  # rotary has no params
    if trainable == "all":
        assert len(tr.names) == len(dict(tr.model.named_parameters()))


def test_bad_input_is_rejected_and_changes_nothing(tiny):
    tr = make(tiny)
    tr.train(batches(1))
    theta, opt = tr.params(), tr.opt_state()
    with pytest.raises(ValueError, match="expected"):
        tr.load_params(theta[:-1])
    with pytest.raises(ValueError, match="float32"):
        tr.load_params([t.double() for t in theta])
    bad = list(opt)
    bad[-1] = torch.tensor([-1], dtype=torch.int64)
    with pytest.raises(ValueError, match="step"):
        tr.load_opt_state(bad)
    with pytest.raises(ValueError, match="expected"):
        tr.load_opt_state(opt[:-1])
    with pytest.raises(ValueError, match="token windows"):
        tr.train([torch.zeros(2, 9)])
    with pytest.raises(ValueError, match="token windows"):
        tr.eval_loss(torch.zeros((0, 9), dtype=torch.long))
    with pytest.raises(ValueError, match="trainable"):
        InnerTrainer(tiny, "some", 4, TARGETS, 1e-2, 0)
    assert all(torch.equal(a, b) for a, b in zip(theta, tr.params(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(opt, tr.opt_state(), strict=True))


def test_scratch_model_is_deterministic_and_trains(tmp_path):
    a = make_scratch_model(tmp_path / "a", seed=3, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    b = make_scratch_model(tmp_path / "b", seed=3, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    assert (a / "manifest.json").read_text().split('"model_id"')[1] == \
        (b / "manifest.json").read_text().split('"model_id"')[1]
    with pytest.raises(ValueError, match="unknown"):
        make_scratch_model(tmp_path / "c", hidden=3)
    tr = InnerTrainer(a, "all", 0, (), 3e-3, 0)
    w = windows(4, vocab=256)
    before = tr.eval_loss(w)
    assert abs(before - torch.log(torch.tensor(256.0)).item()) < 0.3  # near-uniform start
    tr.train([w] * 15)
    assert tr.eval_loss(w) < before - 0.5
