"""Shared by the trainer unit tests: one torch thread, a tiny-model config and learners."""

from __future__ import annotations

import pytest
import torch

from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner
from rlrun.trainer.synthetic import synthetic_config

torch.set_num_threads(1)


@pytest.fixture
def make_learner(tmp_path):
    """make_learner(**trainer_overrides) -> a fresh single-process Learner on tiny-d64."""

    def make(model: str = "tiny-d64", **trainer):
        return build_learner(synthetic_config(tmp_path, model=model, trainer=trainer), Parallelism.single())

    return make
