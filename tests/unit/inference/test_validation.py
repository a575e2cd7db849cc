"""Bad requests are refused with an error naming the field."""

import pytest

from rlrun.common.errors import RequestError
from rlrun.common.wire.inference import check_score
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.validation import check_generate


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ([], SamplingParams(max_tokens=4), "prompt_token_ids"),
        ([1, 2, 128], SamplingParams(max_tokens=4), "prompt_token_ids[2]"),
        ([1, 2], SamplingParams(max_tokens=4, temperature=-0.5), "sampling.temperature"),
        ([1, 2], SamplingParams(max_tokens=31), "sampling.max_tokens"),
        ([1] * 32, SamplingParams(max_tokens=1), "prompt_token_ids"),
        ([1, 2], SamplingParams(max_tokens=4, stop_token_ids=[500]), "sampling.stop_token_ids[0]"),
    ],
)
def test_bad_generate_requests_name_the_field(prompt, params, field):
    with pytest.raises(RequestError) as caught:
        check_generate(prompt, params, vocab_size=128, max_model_len=32)
    assert caught.value.field == field


def test_a_request_that_fills_the_context_exactly_is_fine():
    check_generate([1, 2], SamplingParams(max_tokens=30), vocab_size=128, max_model_len=32)


@pytest.mark.parametrize(
    ("tokens", "start", "temperature", "field"),
    [
        ([1, 2, 3], 0, 1.0, "start"),
        ([1, 2, 3], 3, 1.0, "start"),
        ([1, 2, 3], 1, -1.0, "temperature"),
        ([], 1, 1.0, "token_ids"),
    ],
)
def test_bad_score_requests_name_the_field(tokens, start, temperature, field):
    with pytest.raises(RequestError) as caught:
        check_score(tokens, start, temperature, vocab_size=128, max_model_len=32)
    assert caught.value.field == field
