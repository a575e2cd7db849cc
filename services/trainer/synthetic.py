"""Synthetic training batches shaped like the demo's (a short prompt that never trains, then a
sampled completion with per-token sampling logprobs), and a run config around one of the
shipped tiny models (rlrun.common.builtin), for the benchmark and the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlrun.common import builtin
from rlrun.common.config import RunConfig, resolve_config
from rlrun.common.wire.trace import Channel, LossKind
from rlrun.common.wire.training import TrainingBatch, TrainingSample


def synthetic_config(
    output_dir: Path,
    *,
    model: str | Path = "tiny-d64",
    trainer: dict[str, Any] | None = None,
    inference_addresses: list[str] | None = None,
) -> RunConfig:
    """A run config for the trainer alone: the named tiny model (or the model config file at
    a Path), `trainer` overrides."""
    config, _ = resolve_config(
        {
            "output_dir": str(output_dir),
            "model": {
                "config": str(model if isinstance(model, Path) else builtin.model_config(model)),
                "tokenizer": str(builtin.tokenizer("char")),
            },
            "inference": {"addresses": list(inference_addresses or [])},
            "trainer": dict(trainer or {}),
            "orchestrator": {"train": {"env": [{"id": "reverse-text"}]}},
        }
    )
    return config


def synthetic_batch(
    step: int,
    *,
    num_samples: int = 16,
    vocab_size: int = 128,
    seed: int = 0,
    prompt_len: tuple[int, int] = (4, 10),
    completion_len: tuple[int, int] = (4, 12),
    loss: LossKind = "rl",
    temperature: float = 1.0,
    learning_rate: float | None = None,
) -> TrainingBatch:
    """Token ids avoid 0-2 (pad and specials of the char tokenizer). rl samples carry one
    advantage in {-1, 0, 1} per sample on their completion; ce samples weight 1 there."""
    rng = np.random.default_rng([seed, step])
    samples = []
    for _ in range(num_samples):
        prompt = int(rng.integers(prompt_len[0], prompt_len[1] + 1))
        completion = int(rng.integers(completion_len[0], completion_len[1] + 1))
        n = prompt + completion
        mask = [False] * prompt + [True] * completion
        sampled = rng.uniform(-np.log(vocab_size) - 1.0, -np.log(vocab_size) + 1.0, size=completion)
        logprobs = [0.0] * prompt + [float(x) for x in sampled]
        value = float(rng.integers(-1, 2)) if loss == "rl" else 1.0
        samples.append(
            TrainingSample(
                token_ids=[int(t) for t in rng.integers(3, vocab_size, size=n)],
                mask=mask,
                logprobs=logprobs,
                temperatures=[temperature] * n,
                channels=[Channel(loss, [value if m else 0.0 for m in mask])],
            )
        )
    return TrainingBatch(step=step, policy_version=step, samples=samples, learning_rate=learning_rate)
