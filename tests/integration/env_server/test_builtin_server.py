"""The built-in env-server beyond the shared contract: multi-turn and tool envs, harness
errors, group scoring, env-owned algorithms, per-env logs, replica spreading, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest
from env_test_servers import REPO, child_env, write_config
from env_test_support import last_message, start_inference, wait_until

from rlrun.common.wire.trace import trace_from_proto
from rlrun.v1 import env_pb2, plan_pb2, trace_pb2


def plan(
    addresses, *, rule: bool = False, member: str = "policy", max_tokens: int = 12
) -> plan_pb2.GenerationPlan:
    kind = plan_pb2.ENDPOINT_KIND_RULE if rule else plan_pb2.ENDPOINT_KIND_INFERENCE
    return plan_pb2.GenerationPlan(
        targets=[
            plan_pb2.PlanTarget(
                member_id=member,
                role=plan_pb2.MEMBER_ROLE_TRAIN,
                model=plan_pb2.ModelEndpoint(name=member, kind=kind, addresses=[] if rule else addresses),
                sampling={"temperature": 1.0, "max_tokens": max_tokens},
            )
        ]
    )


def run_group(server, env: str, address: str, *, n: int = 2, idx: int = 0, split: str = "train", **kw):
    request = env_pb2.RunGroupRequest(
        group_id=f"{env}-{idx}",
        task={"env": env, "split": split, "idx": idx},
        plan=plan([address], **kw),
        n=n,
    )
    return [trace_from_proto(t) for t in server.stub.RunGroup(request, timeout=60).traces]


def test_get_info_lists_every_hosted_entry_by_key(builtin_server):
    infos = {e.env_id: e for e in builtin_server.stub.GetInfo(env_pb2.GetInfoRequest()).envs}
    assert set(infos) == {
        "reverse-text",
        "tool-calc",
        "alphabet-sort-multi",
        "alphabet-sort-rewrite",
        "arithmetic",
        "broken",
        "no-reference",
        "ranked",
    }
    assert list(infos["reverse-text"].algorithms) == ["length_penalty"]
    assert infos["ranked"].group_scoring and not infos["reverse-text"].group_scoring
    assert infos["arithmetic"].temperature == pytest.approx(0.7)


def test_tool_results_come_back_as_tool_messages(builtin_server, inference, inference_server, tokenizer):
    def policy(tok, prompt):
        last = last_message(tok, prompt)
        return last if any(ch in last for ch in "0123456789") and "*" not in last else f"calc({last})"

    inference.policy = policy
    [trace] = run_group(builtin_server, "tool-calc", inference_server.address, n=1, idx=5, max_tokens=16)
    problem = json.loads(trace.task.data)["problem"]
    roles = [n.role for n in trace.nodes]
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool = trace.nodes[2]
    assert tool.is_observation and not any(tool.sampled_mask) and tool.logprobs == []
    assert tool.token_ids == tokenizer.render_message("tool", json.loads(trace.task.data)["answer"])
    assert trace.nodes[1].content == f"calc({problem})"
    first, second = inference.requests
    assert list(second.prompt_token_ids)[: len(first.prompt_token_ids)] == list(first.prompt_token_ids)
    assert trace.branch_tokens(0).token_ids == list(second.prompt_token_ids) + trace.nodes[3].token_ids[1:]
    assert trace.reward == pytest.approx(1.0)
    assert trace.metrics["tool_calls"] == 1


def test_multi_turn_feedback_arrives_as_user_messages(builtin_server, inference, inference_server):
    inference.policy = lambda tok, prompt: (
        "zzz"
        if len(inference.requests) == 1
        else "".join(sorted(last_message(tok, inference.requests[0].prompt_token_ids)))
    )
    [trace] = run_group(builtin_server, "alphabet-sort-multi", inference_server.address, n=1, idx=2)
    assert [n.role for n in trace.nodes] == ["user", "assistant", "user", "assistant"]
    feedback = trace.nodes[2]
    assert feedback.is_observation and feedback.content.endswith(
        f"/{len(json.loads(trace.task.data)['answer'])}"
    )
    first, second = inference.requests
    assert list(second.prompt_token_ids)[: len(first.prompt_token_ids)] == list(first.prompt_token_ids)
    assert len(trace.branches) == 1
    assert trace.rewards["similarity"].score == pytest.approx(1.0)
    assert (trace.rewards["extra_turns"].score, trace.rewards["extra_turns"].weight) == (
        1.0,
        pytest.approx(-0.1),
    )
    assert trace.reward == pytest.approx(0.9)


def test_rewritten_history_opens_a_branch_per_attempt(builtin_server, inference, inference_server):
    inference.policy = lambda tok, prompt: "zzz"
    [trace] = run_group(builtin_server, "alphabet-sort-rewrite", inference_server.address, n=1, idx=4)
    assert trace.stop_condition == "max_turns"
    assert len(trace.branches) == 3
    prompt = trace.nodes[0].id
    for index, branch in enumerate(trace.branches):
        assert branch.node_ids[0] == prompt
        assert len(branch.node_ids) == (2 if index == 0 else 3)
    for request, b in zip(inference.requests, range(3), strict=True):
        tokens = trace.branch_tokens(b)
        assert tokens.token_ids[: len(request.prompt_token_ids)] == list(request.prompt_token_ids)


def test_a_harness_bug_is_a_non_retryable_error_trace(builtin_server, inference, inference_server):
    traces = run_group(builtin_server, "broken", inference_server.address, n=3)
    assert len(traces) == 3
    for trace in traces:
        [error] = trace.errors
        assert error.type == "HarnessError" and "TypeError" in error.message and not error.retryable
        assert trace.stop_condition == "error"


def test_an_env_without_reference_answer_rejects_rule_targets(builtin_server):
    request = env_pb2.RunGroupRequest(
        task={"env": "no-reference", "split": "train", "idx": 0},
        n=1,
        plan=plan([], rule=True, member="oracle"),
    )
    with pytest.raises(grpc.RpcError) as caught:
        builtin_server.stub.RunGroup(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "plan.targets[0].model.kind" in caught.value.details()


def test_group_scoring_sees_the_whole_group(builtin_server):
    traces = [
        trace_from_proto(t)
        for t in builtin_server.stub.RunGroup(
            env_pb2.RunGroupRequest(
                group_id="ranked",
                task={"env": "ranked", "split": "train", "idx": 1},
                n=3,
                plan=plan([], rule=True, member="oracle"),
            ),
            timeout=60,
        ).traces
    ]
    assert sorted(t.rewards["rank"].score for t in traces) == [0.0, 0.5, 1.0]


def test_run_algorithms_returns_env_owned_advantages_per_branch(builtin_server, inference, inference_server):
    inference.policy = lambda tok, prompt: last_message(tok, prompt)[::-1]
    traces = builtin_server.stub.RunGroup(
        env_pb2.RunGroupRequest(
            group_id="algo",
            task={"env": "reverse-text", "split": "train", "idx": 9},
            n=4,
            plan=plan([inference_server.address]),
        ),
        timeout=60,
    ).traces
    reply = builtin_server.stub.RunAlgorithms(
        env_pb2.RunAlgorithmsRequest(env_id="reverse-text", algorithms=["length_penalty"], traces=traces),
        timeout=60,
    )
    assert len(reply.results) == 4
    by_id = {t.id: trace_from_proto(t) for t in traces}
    for result in reply.results:
        tokens = by_id[result.trace_id].branch_tokens(result.branch_index)
        assert list(result.mask) == tokens.sampled_mask
        [channel] = result.channels
        assert channel.loss == trace_pb2.LOSS_TYPE_RL and len(channel.values) == len(tokens.token_ids)
        assert channel.values == pytest.approx(
            [0.0] * len(tokens.token_ids)
        )  # identical rollouts: no advantage


def test_run_algorithms_rejects_malformed_traces_naming_the_field(builtin_server):
    bad = trace_pb2.Trace(
        id="t",
        nodes=[
            trace_pb2.MessageNode(id="a", role=trace_pb2.ROLE_USER, token_ids=[1, 2], sampled_mask=[False])
        ],
    )
    with pytest.raises(grpc.RpcError) as caught:
        builtin_server.stub.RunAlgorithms(
            env_pb2.RunAlgorithmsRequest(env_id="reverse-text", algorithms=["length_penalty"], traces=[bad]),
            timeout=60,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "traces[0].nodes[0].sampled_mask" in caught.value.details()


def test_each_rollout_is_logged_in_its_env_and_split_log(builtin_server, inference, inference_server):
    for split in ("train", "eval"):
        run_group(builtin_server, "arithmetic", inference_server.address, n=1, idx=3, split=split)
    for split in ("train", "eval"):
        path = builtin_server.log_dir / "envs" / split / "arithmetic.log"
        wait_until(lambda p=path: p.exists() and "arithmetic-3" in p.read_text(), 30, f"{path}")
        record = json.loads(path.read_text().splitlines()[-1])
        assert (record["env"], record["split"], record["idx"], record["group_id"]) == (
            "arithmetic",
            split,
            3,
            "arithmetic-3",
        )


def test_calls_are_spread_over_the_replicas(builtin_server, inference, inference_server, tokenizer):
    second = start_inference(tokenizer)
    try:
        addresses = [inference_server.address, second.address]
        for idx in range(6):
            request = env_pb2.RunGroupRequest(
                group_id=f"spread-{idx}",
                n=2,
                plan=plan(addresses),
                task={"env": "reverse-text", "split": "train", "idx": idx},
            )
            builtin_server.stub.RunGroup(request, timeout=60)
        assert len(inference.requests) == 3 and len(second.servicer.requests) == 3
    finally:
        second.stop()


def test_serve_rejects_an_unknown_env_name(tmp_path):
    config = write_config(tmp_path / "run.toml", '[[orchestrator.train.env]]\nid = "reverse-text"\n')
    result = subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "serve", "env-server", "--config", str(config), "--env", "nope"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "'nope'" in result.stderr and "reverse-text" in result.stderr
