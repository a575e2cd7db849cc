"""The token contract of Generate responses, replica picking, and error classification."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest

from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.sdk.errors import InvalidModelOutput, ModelCallError, ScoringError, trace_error
from rlrun.env_server.sdk.inference_client import InferenceClient, completions_from_proto
from rlrun.v1 import inference_pb2

STOP, LENGTH = inference_pb2.FINISH_REASON_STOP, inference_pb2.FINISH_REASON_LENGTH


def reply(*completions: dict) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(completions=[inference_pb2.Completion(**c) for c in completions])


def test_a_well_formed_reply_becomes_completions():
    [c] = completions_from_proto(
        reply(
            dict(
                token_ids=[5, 1],
                logprobs=[-0.1, -0.2],
                finish_reason=LENGTH,
                policy_version_start=2,
                policy_version_end=3,
            )
        ),
        1,
        "a:1",
    )
    assert (c.token_ids, c.logprobs, c.finish_reason, c.policy_version_start, c.policy_version_end) == (
        [5, 1],
        pytest.approx([-0.1, -0.2]),
        "length",
        2,
        3,
    )


@pytest.mark.parametrize(
    ("completions", "n"),
    [
        ([dict(token_ids=[5], logprobs=[-0.1], finish_reason=STOP)], 2),
        ([dict(token_ids=[5, 6], logprobs=[-0.1], finish_reason=STOP)], 1),
        ([dict(token_ids=[-3], logprobs=[-0.1], finish_reason=STOP)], 1),
        ([dict(token_ids=[5], logprobs=[0.5], finish_reason=STOP)], 1),
        ([dict(token_ids=[5], logprobs=[math.nan], finish_reason=STOP)], 1),
        ([dict(token_ids=[5], logprobs=[-0.1])], 1),
        (
            [
                dict(
                    token_ids=[5],
                    logprobs=[-0.1],
                    finish_reason=STOP,
                    policy_version_start=3,
                    policy_version_end=2,
                )
            ],
            1,
        ),
    ],
)
def test_a_reply_breaking_the_token_contract_is_invalid_model_output(completions, n):
    with pytest.raises(InvalidModelOutput):
        completions_from_proto(reply(*completions), n, "a:1")


def test_an_aborted_completion_is_a_retryable_model_call_error():
    with pytest.raises(ModelCallError) as caught:
        completions_from_proto(reply(dict(finish_reason=inference_pb2.FINISH_REASON_ABORT)), 1, "a:1")
    assert caught.value.retryable and caught.value.code == "ABORTED"


def test_calls_go_to_the_replica_with_fewest_in_flight_and_ties_rotate():
    client = InferenceClient()
    client.in_flight.update({"a": 2, "b": 0, "c": 0})
    assert {client.pick(["a", "b", "c"]) for _ in range(4)} == {"b", "c"}
    client.in_flight["b"] = 5
    assert client.pick(["a", "b", "c"]) == "c"


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, True),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
        (grpc.StatusCode.INTERNAL, False),
    ],
)
def test_rpc_errors_are_retryable_only_for_infrastructure_faults(code, retryable):
    error = ModelCallError.from_rpc(grpc.aio.AioRpcError(code, None, None, details="boom"), "a:1")
    assert (error.code, error.retryable) == (code.name, retryable)
    assert "a:1" in str(error) and "boom" in str(error)


def test_unreachable_inference_is_a_retryable_model_call_error():
    async def call():
        client = InferenceClient(unavailable_retry_s=1.0)
        try:
            await asyncio.wait_for(client.generate(["127.0.0.1:1"], [3, 4], SamplingParams(max_tokens=2)), 30)
        finally:
            await client.close()

    with pytest.raises(ModelCallError) as caught:
        asyncio.run(call())
    assert caught.value.retryable


def test_failures_map_to_trace_errors():
    scoring = ScoringError("the scorer raised")
    scoring.__cause__ = KeyError("answer")
    cases = [
        (ModelCallError("UNAVAILABLE", "down", True), ("ModelCallError", True)),
        (InvalidModelOutput("junk"), ("InvalidModelOutput", True)),
        (TimeoutError("late"), ("Timeout", True)),
        (scoring, ("ScoringError", False)),
        (TypeError("bug"), ("HarnessError", False)),
    ]
    for error, expected in cases:
        found = trace_error(error)
        assert (found.type, found.retryable) == expected
    assert "KeyError" in trace_error(scoring).message
