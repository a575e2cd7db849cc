"""The debate env behind the real env-server (`rlrun serve env-server`, pool workers and all),
driven over gRPC with a scripted inference service playing the learner."""

from __future__ import annotations

import grpc
import pytest
from env_test_servers import serve_builtin
from env_test_support import LOGPROB

from rlrun.common.wire.trace import trace_from_proto
from rlrun.v1 import env_pb2, plan_pb2

MEMBERS = ("debater_a", "debater_b", "judge")


@pytest.fixture(scope="module")
def debate_server(tmp_path_factory):
    server = serve_builtin(
        tmp_path_factory.mktemp("debate"),
        '[[orchestrator.train.env]]\nid = "debate"\nargs = { opponent_accuracy = 0.0 }\n',
    )
    yield server
    server.stop()


def target(member: str, role: int, address: str | None) -> plan_pb2.PlanTarget:
    kind = plan_pb2.ENDPOINT_KIND_INFERENCE if address else plan_pb2.ENDPOINT_KIND_RULE
    return plan_pb2.PlanTarget(
        member_id=member,
        role=role,
        model=plan_pb2.ModelEndpoint(name=member, kind=kind, addresses=[address] if address else []),
        sampling={"temperature": 1.0, "max_tokens": 12},
    )


def debate_plan(learner_address: str | None, members=MEMBERS) -> plan_pb2.GenerationPlan:
    roles = {"debater_a": plan_pb2.MEMBER_ROLE_TRAIN}
    return plan_pb2.GenerationPlan(
        targets=[
            target(m, roles.get(m, plan_pb2.MEMBER_ROLE_FIXED), learner_address if m == "debater_a" else None)
            for m in members
        ]
    )


def run_group(server, plan, n=3, idx=5):
    request = env_pb2.RunGroupRequest(
        group_id="g", task={"env": "debate", "split": "eval", "idx": idx}, plan=plan, n=n
    )
    return [trace_from_proto(t) for t in server.stub.RunGroup(request, timeout=60).traces]


def test_get_info_lists_the_members(debate_server):
    [info] = debate_server.stub.GetInfo(env_pb2.GetInfoRequest()).envs
    assert (info.env_id, list(info.members)) == ("debate", list(MEMBERS))


def test_a_debate_returns_one_trace_per_member_with_zero_sum_rewards(
    debate_server, inference, inference_server, tokenizer
):
    inference.policy = lambda tok, prompt: "99"  # the learner always claims 99: right only when it is
    traces = run_group(debate_server, debate_plan(inference_server.address))
    assert [(t.rollout_id, t.member_id) for t in traces] == [(f"g/{i}", m) for i in range(3) for m in MEMBERS]
    assert len({t.id for t in traces}) == 9
    for i in range(3):
        learner, opponent, judge = traces[3 * i : 3 * i + 3]
        assert learner.info == opponent.info == judge.info == {"learner_seat": "debater_a"}
        assert learner.reward + opponent.reward == 0 and judge.reward == 0
        # the opponent (accuracy 0) always names the smaller number, so 99 never loses
        assert learner.reward == (1.0 if learner.metrics["correct"] else 0.0)
        [answer] = [n for n in learner.nodes if n.role == "assistant"]
        assert answer.content == "99" and answer.logprobs == [LOGPROB] * 3 and not answer.parse_error
    assert {t.task.example_id for t in traces} == {traces[0].task.example_id}
    # Round 1 is simultaneous, so each episode asks the learner once, on the bare question.
    assert len(inference.requests) == 3
    assert {tokenizer.decode(r.prompt_token_ids) for r in inference.requests} == {traces[0].nodes[0].content}


def test_malformed_thinking_is_committed_with_parse_error(debate_server, inference, inference_server):
    inference.policy = lambda tok, prompt: "<think>9"
    traces = run_group(debate_server, debate_plan(inference_server.address), n=1)
    learner, _, judge = traces
    [answer] = [n for n in learner.nodes if n.role == "assistant"]
    assert answer.parse_error
    assert [n.content for n in judge.nodes if n.is_observation][0] == "a: "  # nothing public


def test_a_plan_without_every_member_is_invalid(debate_server):
    with pytest.raises(grpc.RpcError) as caught:
        run_group(debate_server, debate_plan(None, members=("debater_a", "judge")))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "plan.targets" in caught.value.details() and "one target per member" in caught.value.details()
