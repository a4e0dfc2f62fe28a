"""Learning-rate schedules and the weight-decay rule."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.config import OptimConfig
from trainer.optim import build_optimizer, lr_at, schedule_warning, takes_weight_decay


def test_wsd_warmup_stable_decay_points():
    cfg = OptimConfig(lr=1.0, min_lr=0.01, warmup_steps=10, schedule="wsd", decay_fraction=0.2, decay_shape="linear")
    total = 100
    assert lr_at(0, total, cfg) == pytest.approx(0.1)
    assert lr_at(9, total, cfg) == pytest.approx(1.0)
    assert lr_at(50, total, cfg) == 1.0
    assert lr_at(79, total, cfg) == 1.0  # decay covers steps 80..99
    assert lr_at(80, total, cfg) == pytest.approx(0.01 + 0.99 * (1 - 1 / 20))
    assert lr_at(99, total, cfg) == pytest.approx(0.01)


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_decay_shapes_are_monotone_to_the_floor(shape):
    cfg = OptimConfig(lr=4.5e-4, min_lr=4.5e-6, warmup_steps=5, schedule="wsd", decay_fraction=0.2, decay_shape=shape)
    values = [lr_at(step, 200, cfg) for step in range(160, 200)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert values[-1] == pytest.approx(4.5e-6)
    halfway = lr_at(179, 200, cfg)  # progress 0.5
    expected = {"linear": 0.5, "cosine": 0.5, "1-sqrt": 1 - math.sqrt(0.5)}[shape]
    assert halfway == pytest.approx(4.5e-6 + (4.5e-4 - 4.5e-6) * expected)


def test_cosine_schedule_ends_at_min_lr():
    cfg = OptimConfig(lr=2.0, min_lr=0.5, warmup_steps=4, schedule="cosine")
    assert lr_at(3, 20, cfg) == pytest.approx(2.0)
    assert lr_at(19, 20, cfg) == pytest.approx(0.5)


def test_unknown_schedule_names_the_field():
    with pytest.raises(ValueError, match="optim.schedule"):
        lr_at(50, 100, OptimConfig(schedule="linear-ish", warmup_steps=0))


def test_weight_decay_rule():
    matrix = torch.nn.Parameter(torch.randn(4, 4))
    vector = torch.nn.Parameter(torch.randn(4))
    marked = torch.nn.Parameter(torch.randn(4, 4))
    marked._no_weight_decay = True
    assert takes_weight_decay("layers.0.mixer.in_proj.weight", matrix)
    assert not takes_weight_decay("layers.0.norm.weight", vector)
    assert not takes_weight_decay("layers.0.mixer.A_log", torch.nn.Parameter(torch.randn(4, 1)))
    assert not takes_weight_decay("layers.0.mixer.dt_bias", vector)
    assert not takes_weight_decay("anything", marked)


def test_optimizer_groups_split_decay():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, OptimConfig(weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and len(decay["params"]) == 1  # the Linear weight
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 3  # bias, norm weight + bias


@pytest.mark.parametrize("steps", [3, 20])
def test_a_run_no_longer_than_its_warmup_is_warned_about_with_the_rate_it_ends_at(steps):
    """train.steps=20 with a 20-step warm-up ends at the peak rate, never decaying: said once at start (an
    `lr_schedule_warning` event, printed), not refused: 3 steps of the quickstart are the smoke test."""
    cfg = OptimConfig(lr=3e-3, min_lr=3e-5, warmup_steps=20, schedule="wsd", decay_fraction=0.2)
    warning = schedule_warning(cfg, steps)
    assert warning["warmup_steps"] == 20 and warning["steps"] == steps
    assert warning["last_lr"] == lr_at(steps - 1, steps, cfg) == pytest.approx(3e-3)  # the ramp is clamped to the run
    assert warning["means"].startswith("the run ends inside its warm-up")


def test_a_decay_starting_inside_the_warmup_is_warned_about_and_a_sound_schedule_is_not():
    cfg = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=20, schedule="wsd", decay_fraction=0.2)
    warning = schedule_warning(cfg, 21)  # decay over steps 17..20, warm-up until 20: the rate drops at step 20
    assert warning["decay_start_step"] == 17 and "drops from the ramp onto the decay curve" in warning["means"]
    assert lr_at(19, 21, cfg) == pytest.approx(1.0) and lr_at(20, 21, cfg) == pytest.approx(0.0)
    for schedule in ("wsd", "cosine", "constant"):
        assert schedule_warning(OptimConfig(warmup_steps=20, schedule=schedule), 200) is None  # the quickstart's
    assert schedule_warning(OptimConfig(warmup_steps=0), 1) is None
