"""Fixtures for the inference unit tests: a tiny seeded model and a running torch engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlrun.common.config import ModelConfig
from rlrun.common.model import CausalLM, build_model
from rlrun.common.wire.limits import RequestLimits
from rlrun.inference.engines.torch_engine import TorchEngine

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[3]
MAX_MODEL_LEN = 48
LIMITS = RequestLimits(
    max_group_size=32, max_samples=64, max_messages=MAX_MODEL_LEN, max_text_chars=1024, max_batch_samples=256
)
"""What one request may ask of the engines below (max_samples: their max_waiting)."""


def tiny_model(seed: int = 3) -> CausalLM:
    config = ModelConfig(
        config=REPO / "configs/models/tiny-d64.json",
        tokenizer=REPO / "configs/tokenizer/char",
        seed=seed,
        max_model_len=MAX_MODEL_LEN,
    )
    return build_model(config)


@pytest.fixture
def model() -> CausalLM:
    return tiny_model()


@pytest.fixture
async def engine(model):
    engine = TorchEngine(
        model, model_name="tiny", max_model_len=MAX_MODEL_LEN, max_batch_size=8, max_waiting=64, seed=0
    )
    await engine.start()
    yield engine
    await engine.stop()
