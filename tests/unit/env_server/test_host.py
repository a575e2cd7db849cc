"""EnvHost without its pool running: GetInfo, request validation, logs and metrics."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import REGISTRY

from rlrun.common.config import resolve_config
from rlrun.common.errors import RequestError
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.wire.env import encode_traces, run_group_response_to_proto
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint, PlanTarget, plan_from_proto, plan_to_proto
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.trace import TraceError
from rlrun.env_server.server.host import EnvHost
from rlrun.env_server.server.rollout import RolloutJob, error_traces
from rlrun.v1 import trace_pb2


@pytest.fixture
def host(tmp_path) -> EnvHost:
    config, _ = resolve_config(
        {
            "orchestrator": {
                "train": {
                    "sampling": {"temperature": 0.9},
                    "env": [{"id": "reverse-text", "name": "rt", "sampling": {"temperature": 0.6}}],
                }
            },
        }
    )
    return EnvHost(config.orchestrator.train.env[0], config, tmp_path, ClientOptions())


def plan(kind: str = "inference", **sampling) -> GenerationPlan:
    target = PlanTarget(
        "policy",
        "train",
        ModelEndpoint("policy", kind, ["a:1"] if kind == "inference" else []),
        SamplingParams(**{"max_tokens": 12, **sampling}),
    )
    return GenerationPlan({"policy": target})


def test_info_reports_the_entry(host):
    info = host.info()
    assert (info.env_id, dict(info.task_counts), info.group_scoring) == (
        "rt",
        {"train": 1_000_000, "eval": 256},
        False,
    )
    assert list(info.algorithms) == ["length_penalty"] and list(info.members) == []
    assert info.temperature == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("split", "idx", "field"),
    [("dev", 0, "task.split"), ("eval", 256, "task.idx"), ("train", -5, "task.idx")],
)
def test_task_lookups_outside_the_taskset_name_the_field(host, split, idx, field):
    with pytest.raises(RequestError) as caught:
        host.task(trace_pb2.TaskRef(env="rt", split=split, idx=idx))
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("the_plan", "field"),
    [
        (GenerationPlan({}), "plan.targets"),
        (plan(stop_token_ids=[1000]), "plan.targets[0].sampling.stop_token_ids[0]"),
    ],
)
def test_plans_the_env_cannot_run_name_the_field(host, the_plan, field):
    with pytest.raises(RequestError) as caught:  # as a request's plan arrives: off the wire, then checked
        host.check_plan(plan_from_proto(plan_to_proto(the_plan), vocab_size=host.vocab_size))
    assert caught.value.field == field
    host.check_plan(plan("rule"))


def test_unknown_algorithms_name_their_position(host):
    host.check_algorithms(["length_penalty"])
    with pytest.raises(RequestError) as caught:
        host.check_algorithms(["length_penalty", "grpo"])
    assert caught.value.field == "algorithms[1]"


async def test_a_cancel_before_the_request_arrives_still_cancels_it(host):
    assert host.cancel({"late-group"}, set()) == 0
    job = RolloutJob(
        "rt", host.task(trace_pb2.TaskRef(split="train", idx=1)), plan(), "late-group", ["late-group/0"]
    )
    response = run_group_response_to_proto(await asyncio.wait_for(host.run(job, 5.0), 10))
    [trace] = response.traces
    assert trace.stop_condition == trace_pb2.STOP_CONDITION_CANCELLED


def sample(name: str, labels: dict) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_each_request_is_one_log_line_and_counted(host, tmp_path):
    job = RolloutJob(
        "rt", host.task(trace_pb2.TaskRef(split="eval", idx=3)), plan(), "grp", ["grp/0", "grp/1"]
    )
    traces = error_traces(job, TraceError("Timeout", "late", True))
    traces[0].stop_condition = "completed"
    traces[0].errors.clear()
    before_done = sample(
        "rlrun_env_server_rollouts_total", {"env": "rt", "split": "eval", "stop_condition": "completed"}
    )
    before_err = sample(
        "rlrun_env_server_rollout_errors_total", {"env": "rt", "type": "Timeout", "retryable": "true"}
    )
    host._record(job, encode_traces(traces).summaries())
    host.rollout_log.close()
    [line] = (tmp_path / "envs" / "eval" / "rt.log").read_text().splitlines()
    record = json.loads(line)
    assert (record["env"], record["split"], record["idx"], record["group_id"]) == ("rt", "eval", 3, "grp")
    assert record["rollout_ids"] == ["grp/0", "grp/1"]
    assert record["errors"] == [
        {"rollout_id": "grp/1", "type": "Timeout", "message": "late", "retryable": True}
    ]
    assert (
        sample(
            "rlrun_env_server_rollouts_total", {"env": "rt", "split": "eval", "stop_condition": "completed"}
        )
        == before_done + 1
    )
    assert (
        sample("rlrun_env_server_rollout_errors_total", {"env": "rt", "type": "Timeout", "retryable": "true"})
        == before_err + 1
    )
