"""The held-out loss an aggregate claims per round (node.training.heldout), on the tiny model with real torch:
it is θ_{r+1}'s loss on the run's held-out tail, the node's cached trainer is left as it was, and the committee's
rule tells the true claim from a stale or made-up one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from node.compute.model import make_tiny
from node.compute.train import encode_text, split_tokens
from node.training import rounds as rd
from node.training.assign import make_windows
from node.training.heldout import (
    HELD_WINDOWS,
    HELDOUT_TOL_PPM,
    heldout_agrees,
    heldout_loss_ppm,
    heldout_windows,
    run_data,
)

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_bytes()
POST = dict(trainable="lora", rank=4, targets="q_proj,v_proj", lr_micro=10_000, seed=3, seq_len=16)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.set_num_threads(1)
    model = make_tiny(tmp_path_factory.mktemp("models"), seed=0)
    return model, rd.make_trainer(model, POST)


def test_the_held_out_windows_are_the_tail_never_trained_on(world):
    model, _ = world
    held = heldout_windows(model, SimpleNamespace(**POST), TEXT)
    _, held_ids = split_tokens(encode_text(model, TEXT))
    assert held.shape == (HELD_WINDOWS, POST["seq_len"] + 1)
    assert torch.equal(held, make_windows(held_ids, POST["seq_len"])[:HELD_WINDOWS])
    assert heldout_windows(model, SimpleNamespace(**{**POST, "seq_len": 10**6}), TEXT) is None  # tail too short
    windows, held2 = run_data(model, SimpleNamespace(**POST), TEXT)  # a node's one tokenization gives both
    assert torch.equal(held2, held) and torch.equal(windows, rd.run_windows(model, SimpleNamespace(**POST), TEXT))


def test_the_claim_is_the_new_thetas_loss_and_a_stale_or_made_up_one_disagrees(world):
    model, trainer = world
    held = heldout_windows(model, SimpleNamespace(**POST), TEXT)
    theta0 = trainer.params()
    gen = torch.Generator().manual_seed(1)
    theta1 = [t + 0.05 * torch.randn(t.shape, generator=gen) for t in theta0]  # θ_{r+1}: LoRA B is no longer 0
    m1 = heldout_loss_ppm(trainer, theta1, held)
    assert all(torch.equal(a, b) for a, b in zip(trainer.params(), theta0, strict=True))  # the trainer is restored
    trainer.load_params(theta1)
    assert m1 == round(trainer.eval_loss(held) * 1e6) > 0
    trainer.load_params(theta0)
    m0 = heldout_loss_ppm(trainer, theta0, held)
    assert abs(m1 - m0) > HELDOUT_TOL_PPM  # θ_r's loss claimed for θ_{r+1} is caught
    assert heldout_agrees(m1, heldout_loss_ppm(trainer, theta1, held))  # the honest claim: measured again
    assert not heldout_agrees(m0, m1)
    assert not heldout_agrees(m1 - HELDOUT_TOL_PPM - 1, m1) and heldout_agrees(m1 - HELDOUT_TOL_PPM, m1)
    assert heldout_agrees(0, m1)  # an aggregate that claims none (optional field)
    assert not heldout_agrees(m1, 0)  # a claim the member could not measure (no windows, non-finite) fails
    assert heldout_loss_ppm(trainer, theta1, None) == 0
    nan = [torch.full_like(t, float("nan")) for t in theta0]
    assert heldout_loss_ppm(trainer, nan, held) == 0
    assert all(torch.equal(a, b) for a, b in zip(trainer.params(), theta0, strict=True))
