"""The learning-rate schedule and AdamW parameter groups."""

from __future__ import annotations

import math

import pytest

from rlrun.common.config.trainer import ScheduleConfig
from rlrun.trainer.optim import LRFactor, lr_factor


def test_warmup_is_linear_and_reaches_the_peak_on_its_last_step():
    factor = LRFactor(kind="constant", warmup_steps=4, total_steps=10, min_lr_ratio=0.0)
    assert [factor(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_decay_reaches_the_floor_at_total_steps():
    factor = LRFactor(kind="linear", warmup_steps=0, total_steps=10, min_lr_ratio=0.1)
    assert factor(0) == pytest.approx(1.0)
    assert factor(5) == pytest.approx(0.55)
    assert factor(10) == pytest.approx(0.1)
    assert factor(50) == pytest.approx(0.1)


def test_cosine_decay_after_warmup():
    factor = LRFactor(kind="cosine", warmup_steps=2, total_steps=12, min_lr_ratio=0.0)
    assert factor(1) == pytest.approx(1.0)
    assert factor(2) == pytest.approx(1.0)
    assert factor(7) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factor(12) == pytest.approx(0.0)


def test_unset_total_steps_means_the_runs_total():
    assert lr_factor(ScheduleConfig(kind="linear"), run_total_steps=40).total_steps == 40
    assert lr_factor(ScheduleConfig(kind="linear", total_steps=7), run_total_steps=40).total_steps == 7


def test_weight_decay_applies_to_matrices_only(make_learner):
    learner = make_learner(weight_decay=0.1)
    decay, no_decay = learner.optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["params"]
