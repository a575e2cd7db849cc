"""The EnvService contract, run against the built-in server and the external example alike."""

from __future__ import annotations

import json

import grpc
import pytest
from env_test_support import LOGPROB, POLICY_VERSION

from rlrun.common.wire.trace import trace_from_proto
from rlrun.v1 import env_pb2, plan_pb2, trace_pb2

ENV = "reverse-text"


@pytest.fixture(params=["builtin", "external"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")


def plan(
    addresses: list[str],
    *,
    temperature: float = 1.0,
    max_tokens: int = 12,
    rule: bool = False,
    member: str = "policy",
) -> plan_pb2.GenerationPlan:
    kind = plan_pb2.ENDPOINT_KIND_RULE if rule else plan_pb2.ENDPOINT_KIND_INFERENCE
    return plan_pb2.GenerationPlan(
        targets=[
            plan_pb2.PlanTarget(
                member_id=member,
                role=plan_pb2.MEMBER_ROLE_FIXED if rule else plan_pb2.MEMBER_ROLE_TRAIN,
                model=plan_pb2.ModelEndpoint(name=member, kind=kind, addresses=[] if rule else addresses),
                sampling={"temperature": temperature, "max_tokens": max_tokens},
            )
        ]
    )


def group(address: str, *, idx: int = 0, n: int = 8, split: str = "train", group_id: str = "g", **kw):
    return env_pb2.RunGroupRequest(
        group_id=group_id, task={"env": ENV, "split": split, "idx": idx}, plan=plan([address], **kw), n=n
    )


def test_get_info_describes_the_env(server):
    [info] = [e for e in server.stub.GetInfo(env_pb2.GetInfoRequest()).envs if e.env_id == ENV]
    assert info.task_counts["eval"] == 256
    assert info.task_counts["train"] >= 100_000
    # Declaring a temperature is optional (0); a declared one must be the run's (1.0).
    assert info.temperature == 0 or info.temperature == pytest.approx(1.0)
    assert list(info.members) == []


def test_a_group_is_one_generate_call_with_n(server, inference, inference_server):
    response = server.stub.RunGroup(group(inference_server.address, n=8), timeout=60)
    assert len(response.traces) == 8
    assert len(inference.requests) == 1
    assert inference.requests[0].sampling.n == 8


def test_traces_are_message_graphs_of_what_the_model_saw(server, inference, inference_server, tokenizer):
    response = server.stub.RunGroup(group(inference_server.address, idx=7, group_id="graph"), timeout=60)
    [request] = inference.requests
    ids = set()
    for message in response.traces:
        trace = trace_from_proto(message)
        ids.add(trace.id)
        text = json.loads(trace.task.data)["text"]
        completion = tokenizer.encode(text[::-1]) + [tokenizer.eos_token_id]
        assert trace.member_id == "policy" and trace.group_id == "graph"
        assert trace.task.env == ENV and trace.task.split == "train" and trace.task.idx == 7
        assert trace.task.example_id not in (None, "")
        [user, assistant] = trace.nodes
        assert (user.role, assistant.role, assistant.parent) == ("user", "assistant", user.id)
        assert user.token_ids == tokenizer.render_message("user", text)
        assert user.token_ids + tokenizer.message_header("assistant") == list(request.prompt_token_ids)
        assert len(trace.branches) == 1
        branch = trace.branch_tokens(0)
        assert branch.token_ids == list(request.prompt_token_ids) + completion
        assert branch.sampled_mask == [False] * len(request.prompt_token_ids) + [True] * len(completion)
        assert assistant.logprobs == pytest.approx([LOGPROB] * len(completion))
        assert user.logprobs == []
        assert trace.reward == pytest.approx(1.0)
        assert trace.reward == pytest.approx(sum(c.score * c.weight for c in trace.rewards.values()))
        assert trace.stop_condition == "completed" and not trace.is_truncated and not trace.errors
        assert trace.policy_span == (POLICY_VERSION, POLICY_VERSION)
    assert len(ids) == 8


def test_run_rollout_returns_one_trace_under_the_given_id(server, inference, inference_server):
    request = env_pb2.RunRolloutRequest(
        rollout_id="r-1",
        group_id="g-1",
        task={"env": ENV, "split": "train", "idx": 3},
        plan=plan([inference_server.address]),
    )
    [trace] = server.stub.RunRollout(request, timeout=60).traces
    assert (trace.id, trace.rollout_id, trace.group_id) == ("r-1", "r-1", "g-1")
    assert inference.requests[0].sampling.n in (0, 1)


def test_eval_is_greedy_when_the_plan_says_so(server, inference, inference_server):
    response = server.stub.RunGroup(
        group(inference_server.address, split="eval", idx=255, n=1, temperature=0.0), timeout=60
    )
    assert inference.requests[0].sampling.temperature == 0.0
    assert response.traces[0].task.split == "eval"


def test_the_completion_budget_is_kept_and_truncation_reported(server, inference, inference_server):
    inference.policy = lambda tokenizer, prompt: "abcdefghijk"
    [trace] = server.stub.RunGroup(group(inference_server.address, n=1, max_tokens=4), timeout=60).traces
    assert inference.requests[0].sampling.max_tokens == 4
    assert trace.is_truncated
    assert trace.stop_condition == trace_pb2.STOP_CONDITION_LENGTH


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: setattr(r.task, "env", "no-such-env"), "task.env"),
        (lambda r: setattr(r.task, "split", "test"), "task.split"),
        (lambda r: setattr(r.task, "idx", 256), "task.idx"),
        (lambda r: setattr(r.task, "idx", -1), "task.idx"),
        (
            lambda r: setattr(r.plan.targets[0].sampling, "temperature", -1.0),
            "plan.targets[0].sampling.temperature",
        ),
        (
            lambda r: setattr(r.plan.targets[0].sampling, "max_tokens", 0),
            "plan.targets[0].sampling.max_tokens",
        ),
        (lambda r: r.plan.ClearField("targets"), "plan.targets"),
        (lambda r: setattr(r, "n", 0), "n"),
    ],
)
def test_bad_requests_get_invalid_argument_naming_the_field(
    server, inference, inference_server, change, field
):
    request = group(inference_server.address, split="eval")
    change(request)
    with pytest.raises(grpc.RpcError) as caught:
        server.stub.RunGroup(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in caught.value.details()
    assert inference.requests == []


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (env_pb2.RunAlgorithmsRequest(env_id="no-such-env"), "env_id"),
        (env_pb2.RunAlgorithmsRequest(env_id=ENV, algorithms=["no-such-algorithm"]), "algorithms[0]"),
    ],
)
def test_bad_algorithm_requests_get_invalid_argument(server, request_, field):
    with pytest.raises(grpc.RpcError) as caught:
        server.stub.RunAlgorithms(request_, timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in caught.value.details()


def test_a_rule_target_plays_the_reference_answer(server, inference, tokenizer):
    request = env_pb2.RunGroupRequest(
        group_id="oracle",
        task={"env": ENV, "split": "train", "idx": 11},
        n=2,
        plan=plan([], rule=True, member="oracle"),
    )
    for message in server.stub.RunGroup(request, timeout=60).traces:
        trace = trace_from_proto(message)
        answer = tokenizer.encode(json.loads(trace.task.data)["text"][::-1]) + [tokenizer.eos_token_id]
        assistant = trace.nodes[-1]
        assert assistant.token_ids == tokenizer.message_header("assistant") + answer
        assert assistant.sampled_mask == [False] + [True] * len(answer)
        assert assistant.logprobs == [0.0] * len(answer)
        assert trace.reward == pytest.approx(1.0)
    assert inference.requests == []


@pytest.mark.parametrize(
    ("code", "retryable"), [(grpc.StatusCode.UNAVAILABLE, True), (grpc.StatusCode.INTERNAL, False)]
)
def test_a_failed_model_call_is_a_trace_with_an_error(server, inference, inference_server, code, retryable):
    inference.fail_with = code
    response = server.stub.RunGroup(group(inference_server.address, n=3), timeout=60)
    assert len(response.traces) == 3
    for trace in response.traces:
        assert trace.stop_condition == trace_pb2.STOP_CONDITION_ERROR
        [error] = trace.errors
        assert error.type == "ModelCallError" and code.name in error.message
        assert error.retryable is retryable
        trace_from_proto(trace)


def test_a_rollout_that_outlives_the_deadline_returns_a_timeout_trace_in_time(
    server, inference, inference_server
):
    inference.hold = __import__("threading").Event()
    response = server.stub.RunGroup(group(inference_server.address, n=2), timeout=3)
    for trace in response.traces:
        [error] = trace.errors
        assert (error.type, error.retryable) == ("Timeout", True)
        assert trace.stop_condition == trace_pb2.STOP_CONDITION_ERROR


def test_cancel_stops_a_running_group(server, inference, inference_server):
    inference.hold = __import__("threading").Event()
    future = server.stub.RunGroup.future(group(inference_server.address, n=4, group_id="doomed"), timeout=60)
    assert inference.arrived.wait(30)
    assert server.stub.Cancel(env_pb2.CancelRequest(group_ids=["doomed"]), timeout=10).cancelled == 4
    response = future.result(timeout=30)
    assert len(response.traces) == 4
    for trace in response.traces:
        assert trace.stop_condition == trace_pb2.STOP_CONDITION_CANCELLED
        assert [e.type for e in trace.errors] == ["Cancelled"]
        trace_from_proto(trace)


def test_cancel_of_unknown_ids_cancels_nothing(server):
    assert (
        server.stub.Cancel(
            env_pb2.CancelRequest(group_ids=["nobody"], rollout_ids=["none"]), timeout=10
        ).cancelled
        == 0
    )
