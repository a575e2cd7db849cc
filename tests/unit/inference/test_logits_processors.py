"""The logits processors behind the OpenAI knobs: which a batch runs, in which order."""

from __future__ import annotations

import torch

from rlrun.inference.logits import PROCESSORS, LogitBias, MinTokens, Penalties
from rlrun.inference.sampler import BatchSampler, LogitAdjustments, RowSettings


def history(generated: int):
    return lambda row: ([1, 2], [3] * generated)


def kinds(sampler: BatchSampler) -> list[type]:
    return [type(p) for p in sampler.processors]


def test_a_batch_without_knobs_runs_no_processor():
    assert BatchSampler([RowSettings(1.0), RowSettings(0.0, top_k=2)]).processors == []


def test_each_knob_is_its_own_processor_in_vllms_order():
    assert [cls.__name__ for cls in PROCESSORS] == ["LogitBias", "MinTokens", "Penalties", "Grammar"]
    both = LogitAdjustments(logit_bias={1: 5.0}, presence_penalty=0.5, min_tokens=3, stop_token_ids=(0,))
    sampler = BatchSampler([RowSettings(1.0), RowSettings(1.0, adjustments=both)], history=history(0))
    assert kinds(sampler) == [LogitBias, MinTokens, Penalties]
    # min_tokens already reached: its mask is gone
    assert kinds(BatchSampler([RowSettings(1.0, adjustments=both)], history=history(5))) == [
        LogitBias,
        Penalties,
    ]


def test_processors_act_on_their_rows_only():
    bias = LogitAdjustments(logit_bias={2: 100.0})
    held = LogitAdjustments(min_tokens=2, stop_token_ids=(2,))
    sampler = BatchSampler(
        [RowSettings(0.0), RowSettings(0.0, adjustments=bias), RowSettings(0.0, adjustments=held)],
        history=history(0),
    )
    logits = torch.zeros(3, 4)
    logits[:, 2] = 1.0
    tokens, _, _ = sampler.sample(logits, None)
    assert tokens.tolist()[:2] == [2, 2] and tokens.tolist()[2] != 2
