"""Proto <-> in-process conversion: round trips and precise validation errors."""

import math

import pytest

from rlrun.common.wire import WireError
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint, PlanTarget, plan_from_proto, plan_to_proto
from rlrun.common.wire.sampling import SamplingParams, sampling_from_proto, sampling_to_proto
from rlrun.common.wire.trace import (
    Branch,
    Channel,
    MessageNode,
    RewardComponent,
    TaskRef,
    Trace,
    TraceError,
    trace_from_proto,
    trace_to_proto,
)
from rlrun.common.wire.training import TrainingBatch, TrainingSample, batch_from_proto, batch_to_proto
from rlrun.v1 import trace_pb2


def make_trace(example_id=7) -> Trace:
    prompt = MessageNode(
        id="n0", role="user", token_ids=[3, 10, 11, 1], sampled_mask=[False] * 4, content="ab"
    )
    answer = MessageNode(
        id="n1",
        parent="n0",
        role="assistant",
        token_ids=[4, 11, 10, 1],
        sampled_mask=[False, True, True, True],
        logprobs=[-0.1, -0.2, -0.3],
        content="ba",
    )
    retry = MessageNode(
        id="n2",
        parent="n0",
        role="assistant",
        token_ids=[4, 10, 1],
        sampled_mask=[False, True, True],
        logprobs=[-1.0, -0.5],
    )
    return Trace(
        id="t1",
        rollout_id="r1",
        group_id="g1",
        member_id="policy",
        task=TaskRef(env="reverse-text", split="train", idx=5, example_id=example_id, data='{"text": "ab"}'),
        nodes=[prompt, answer, retry],
        branches=[
            Branch(node_ids=["n0", "n1"], channels=[Channel("rl", [0.5] * 8)], mask=[False] * 5 + [True] * 3),
            Branch(node_ids=["n0", "n2"]),
        ],
        rewards={"edit": RewardComponent(1.0, 1.0)},
        reward=1.0,
        metrics={"len": 2.0},
        errors=[TraceError("Timeout", "slow", True)],
        stop_condition="completed",
        is_truncated=False,
        policy_span=(3, 4),
        timing={"setup_s": 0.05, "generation_s": 0.1, "scoring_s": 0.0, "total_s": 0.2},
        info={"learner_seat": "a"},
    )


@pytest.mark.parametrize("example_id", [7, "ex-7", None])
def test_trace_round_trip(example_id):
    trace = make_trace(example_id)
    back = trace_from_proto(trace_pb2.Trace.FromString(trace_to_proto(trace).SerializeToString()))
    assert back.task.example_id == example_id
    assert back.nodes[1].logprobs == pytest.approx([-0.1, -0.2, -0.3])
    back.nodes[1].logprobs = trace.nodes[1].logprobs
    back.nodes[2].logprobs = trace.nodes[2].logprobs
    assert back == trace


def test_branch_tokens_concatenate_what_the_model_saw():
    trace = make_trace()
    tokens = trace.branch_tokens(0)
    assert tokens.token_ids == [3, 10, 11, 1, 4, 11, 10, 1]
    assert tokens.sampled_mask == [False] * 5 + [True] * 3
    assert tokens.logprobs == [0.0] * 5 + [-0.1, -0.2, -0.3]
    assert trace.branch_tokens(1).token_ids == [3, 10, 11, 1, 4, 10, 1]


def corrupt(mutate) -> trace_pb2.Trace:
    msg = trace_to_proto(make_trace())
    mutate(msg)
    return msg


@pytest.mark.parametrize(
    ("mutate", "field", "text"),
    [
        (
            lambda m: m.branches[0].mask.append(True),
            "trace.branches[0].mask",
            "has 9 entries but token_ids has 8",
        ),
        (
            lambda m: m.branches[0].channels[0].values.pop(),
            "trace.branches[0].channels[0].values",
            "has 7 entries",
        ),
        (
            lambda m: m.nodes[1].sampled_mask.pop(),
            "trace.nodes[1].sampled_mask",
            "has 3 entries but token_ids has 4",
        ),
        (lambda m: m.nodes[1].logprobs.append(-1.0), "trace.nodes[1].logprobs", "marks 3 sampled tokens"),
        (lambda m: setattr(m, "reward", math.nan), "trace.reward", "not a finite number"),
        (lambda m: m.nodes[1].logprobs.__setitem__(0, math.inf), "trace.nodes[1].logprobs[0]", "inf"),
        (
            lambda m: setattr(m.nodes[2], "parent", "zz"),
            "trace.nodes[2].parent",
            "does not name an earlier node",
        ),
        (
            lambda m: m.branches[1].node_ids.__setitem__(1, "n9"),
            "trace.branches[1].node_ids[1]",
            "names no node",
        ),
        (
            lambda m: setattr(m.nodes[0], "role", trace_pb2.ROLE_UNSPECIFIED),
            "trace.nodes[0].role",
            "unspecified",
        ),
        (
            lambda m: setattr(m.branches[0].channels[0], "loss", 0),
            "trace.branches[0].channels[0].loss",
            "unspecified",
        ),
        (lambda m: setattr(m.nodes[1], "id", "n0"), "trace.nodes[1].id", "not unique"),
    ],
)
def test_trace_validation_names_the_field(mutate, field, text):
    with pytest.raises(WireError) as error:
        trace_from_proto(corrupt(mutate))
    assert error.value.field == field
    assert text in str(error.value)


def test_branch_must_follow_parent_links():
    msg = corrupt(lambda m: m.branches[0].node_ids.__setitem__(0, "n2"))
    with pytest.raises(WireError, match=r"branches\[0\]"):
        trace_from_proto(msg)


def make_batch() -> TrainingBatch:
    sample = TrainingSample(
        token_ids=[1, 2, 3],
        mask=[False, True, True],
        logprobs=[0.0, -0.5, -0.2],
        temperatures=[1.0, 1.0, 1.0],
        channels=[Channel("rl", [0, 1, 1]), Channel("ce", [0, 0, 1])],
    )
    return TrainingBatch(
        step=4, policy_version=4, samples=[sample, sample], metrics={"reward": 0.5}, learning_rate=3e-3
    )


def test_batch_round_trip():
    batch = make_batch()
    back = batch_from_proto(batch_to_proto(batch), vocab_size=16)
    assert back.step == 4 and back.learning_rate == pytest.approx(3e-3)
    assert back.samples[0].channels[1] == Channel("ce", [0.0, 0.0, 1.0])
    no_lr = make_batch()
    no_lr.learning_rate = None
    assert batch_from_proto(batch_to_proto(no_lr)).learning_rate is None


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m.samples[1].mask.append(True), "batch.samples[1].mask"),
        (lambda m: m.samples[0].temperatures.__setitem__(1, 0.0), "batch.samples[0].temperatures[1]"),
        (lambda m: m.samples[0].logprobs.__setitem__(2, math.nan), "batch.samples[0].logprobs[2]"),
        (lambda m: m.samples[0].token_ids.__setitem__(0, 99), "batch.samples[0].token_ids[0]"),
        (lambda m: m.samples[0].channels[0].values.append(1.0), "batch.samples[0].channels[0].values"),
        (lambda m: m.ClearField("samples"), "batch.samples"),
    ],
)
def test_batch_validation_names_the_field(mutate, field):
    msg = batch_to_proto(make_batch())
    mutate(msg)
    with pytest.raises(WireError) as error:
        batch_from_proto(msg, vocab_size=16)
    assert error.value.field == field


def test_sampling_round_trip_and_defaults():
    params = SamplingParams(
        max_tokens=8, temperature=0.7, top_p=0.9, top_k=5, stop_token_ids=[1], seed=3, n=4
    )
    back = sampling_from_proto(sampling_to_proto(params))
    assert (back.top_k, back.seed, back.n, back.stop_token_ids) == (5, 3, 4, [1])
    assert back.top_p == pytest.approx(0.9)
    plain = sampling_from_proto(sampling_to_proto(SamplingParams(max_tokens=8, temperature=0.0)))
    assert (plain.top_p, plain.top_k, plain.seed, plain.n) == (1.0, 0, None, 1)


@pytest.mark.parametrize(
    ("params", "kwargs", "field"),
    [
        (SamplingParams(max_tokens=4, temperature=-1.0), {}, "sampling.temperature"),
        (SamplingParams(max_tokens=0), {}, "sampling.max_tokens"),
        (SamplingParams(max_tokens=30), {"max_model_len": 32, "prompt_len": 5}, "sampling.max_tokens"),
        (
            SamplingParams(max_tokens=4, stop_token_ids=[200]),
            {"vocab_size": 128},
            "sampling.stop_token_ids[0]",
        ),
        (SamplingParams(max_tokens=4, top_p=1.5), {}, "sampling.top_p"),
    ],
)
def test_sampling_validation(params, kwargs, field):
    with pytest.raises(WireError) as error:
        sampling_from_proto(sampling_to_proto(params), **kwargs)
    assert error.value.field == field


def test_plan_round_trip_and_validation():
    plan = GenerationPlan(
        {
            "debater_a": PlanTarget(
                "debater_a",
                "train",
                ModelEndpoint("policy", "inference", ["127.0.0.1:1"]),
                SamplingParams(max_tokens=8),
            ),
            "judge": PlanTarget(
                "judge", "fixed", ModelEndpoint("judge", "rule"), SamplingParams(max_tokens=8, temperature=0)
            ),
        }
    )
    back = plan_from_proto(plan_to_proto(plan))
    assert back == plan and back.is_multi_agent
    broken = plan_to_proto(plan)
    broken.targets[0].model.ClearField("addresses")
    with pytest.raises(WireError, match="addresses is empty"):
        plan_from_proto(broken)
