"""The logits processors behind the OpenAI knobs: which a batch runs, in which order, and how
each reads, checks and hands on its settings."""

from __future__ import annotations

import pytest
import torch

from rlrun.common.errors import RequestError
from rlrun.inference.logits import (
    PROCESSORS,
    LogitBias,
    MinTokens,
    Penalties,
    RequestFields,
    read_knobs,
    register,
    vllm_kwargs,
)
from rlrun.inference.logits.penalties import PenaltySettings
from rlrun.inference.params import GenerationParams
from rlrun.inference.sampler import BatchSampler, RowSettings


def history(generated: int):
    return lambda row: ([1, 2], [3] * generated)


def kinds(sampler: BatchSampler) -> list[type]:
    return [type(p) for p in sampler.processors]


def test_a_batch_without_knobs_runs_no_processor():
    assert BatchSampler([RowSettings(1.0), RowSettings(0.0, top_k=2)]).processors == []


def test_each_knob_is_its_own_processor_in_vllms_order():
    assert [cls.__name__ for cls in PROCESSORS.values()] == ["LogitBias", "MinTokens", "Penalties", "Grammar"]
    both = {
        "logit_bias": {1: 5.0},
        "min_tokens": (3, (0,)),
        "penalties": PenaltySettings(presence_penalty=0.5),
    }
    sampler = BatchSampler([RowSettings(1.0), RowSettings(1.0, knobs=both)], history=history(0))
    assert kinds(sampler) == [LogitBias, MinTokens, Penalties]
    # min_tokens already reached: its mask is gone
    assert kinds(BatchSampler([RowSettings(1.0, knobs=both)], history=history(5))) == [LogitBias, Penalties]


def test_processors_act_on_their_rows_only():
    sampler = BatchSampler(
        [
            RowSettings(0.0),
            RowSettings(0.0, knobs={"logit_bias": {2: 100.0}}),
            RowSettings(0.0, knobs={"min_tokens": (2, (2,))}),
        ],
        history=history(0),
    )
    logits = torch.zeros(3, 4)
    logits[:, 2] = 1.0
    tokens, _, _ = sampler.sample(logits, None)
    assert tokens.tolist()[:2] == [2, 2] and tokens.tolist()[2] != 2


def test_knobs_read_their_fields_and_leave_out_what_changes_nothing():
    fields = RequestFields(
        {
            "logit_bias": {"7": 3, "9": -1.5},
            "presence_penalty": 0.5,
            "min_tokens": 0,
            "repetition_penalty": None,
        }
    )
    assert read_knobs(fields) == {
        "logit_bias": {7: 3.0, 9: -1.5},
        "penalties": PenaltySettings(presence_penalty=0.5),
    }
    assert read_knobs(RequestFields({"frequency_penalty": 0, "logit_bias": {}})) == {}


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"logit_bias": {"1": "a"}}, "logit_bias"),
        ({"presence_penalty": "0.5"}, "presence_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"min_tokens": 1.5}, "min_tokens"),
    ],
)
def test_a_knob_of_the_wrong_shape_is_refused_by_its_field(fields, where):
    with pytest.raises(RequestError) as caught:
        read_knobs(RequestFields(fields))
    assert caught.value.field == where


@pytest.mark.parametrize(
    ("knobs", "where"),
    [
        ({"logit_bias": {50: 1.0}}, "sampling.logit_bias"),
        ({"logit_bias": {5: 101.0}}, "sampling.logit_bias"),
        ({"penalties": PenaltySettings(frequency_penalty=-2.5)}, "sampling.frequency_penalty"),
        ({"penalties": PenaltySettings(repetition_penalty=0.0)}, "sampling.repetition_penalty"),
        ({"min_tokens": 9}, "sampling.min_tokens"),
        ({"no_such_knob": 1}, "no_such_knob"),
    ],
)
def test_params_refuse_knobs_out_of_range_by_their_field(knobs, where):
    with pytest.raises(RequestError) as caught:
        GenerationParams(max_tokens=8, knobs=knobs).validate(vocab_size=32)
    assert caught.value.field == where


def test_a_registered_name_is_taken():
    with pytest.raises(ValueError, match="registered already"):
        register(MinTokens)


def test_vllm_gets_every_knob_neutral_unless_set():
    neutral = vllm_kwargs({})
    assert neutral == {
        "logit_bias": None,
        "min_tokens": 0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
    }
    assert vllm_kwargs({"min_tokens": 3})["min_tokens"] == 3
