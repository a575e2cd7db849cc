"""The env-server against the real torch inference service (tiny model, CPU): traces keep
the token contract, and 256 concurrent rollouts complete without errors."""

from __future__ import annotations

import asyncio
import importlib
import sys

import grpc
import pytest
from env_test_servers import serve_builtin, start_server

from rlrun.common.wire.trace import trace_from_proto
from rlrun.v1 import env_pb2, env_pb2_grpc, plan_pb2, trace_pb2

importlib.import_module("rlrun.inference.cli")

ENVS = """
[inference]
max_batch_size = 128
[[orchestrator.train.env]]
id = "reverse-text"
pool = { type = "elastic", num_workers = 1, max_workers = 2, multiplex = 128 }
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    env_server = serve_builtin(tmp, ENVS)
    inference = start_server(
        "inference",
        [
            sys.executable,
            "-m",
            "rlrun.cli",
            "serve",
            "inference",
            "--config",
            str(tmp / "run.toml"),
            "--log-dir",
            str(tmp / "logs"),
        ],
    )
    yield env_server, inference
    env_server.stop()
    inference.stop()


def plan(address: str, temperature: float = 1.0) -> plan_pb2.GenerationPlan:
    return plan_pb2.GenerationPlan(
        targets=[
            plan_pb2.PlanTarget(
                member_id="policy",
                role=plan_pb2.MEMBER_ROLE_TRAIN,
                model=plan_pb2.ModelEndpoint(
                    name="policy", kind=plan_pb2.ENDPOINT_KIND_INFERENCE, addresses=[address]
                ),
                sampling={"temperature": temperature, "max_tokens": 12},
            )
        ]
    )


def test_real_completions_keep_the_token_contract(stack, tokenizer):
    env_server, inference = stack
    request = env_pb2.RunGroupRequest(
        group_id="real",
        task={"env": "reverse-text", "split": "eval", "idx": 0},
        n=8,
        plan=plan(inference.address),
    )
    for message in env_server.stub.RunGroup(request, timeout=120).traces:
        trace = trace_from_proto(message)
        assert not trace.errors
        assistant = trace.nodes[-1]
        assert assistant.sampled_mask == [False] + [True] * (len(assistant.token_ids) - 1)
        assert all(lp <= 0.0 for lp in assistant.logprobs)
        assert 1 <= assistant.num_sampled <= 12
        assert trace.is_truncated == (tokenizer.eos_token_id not in assistant.token_ids)
        assert 0.0 <= trace.reward <= 1.0


async def test_256_concurrent_rollouts_complete_without_errors(stack):
    env_server, inference = stack
    async with grpc.aio.insecure_channel(env_server.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        groups = [
            stub.RunGroup(
                env_pb2.RunGroupRequest(
                    group_id=f"load-{i}",
                    n=8,
                    plan=plan(inference.address),
                    task={"env": "reverse-text", "split": "train", "idx": i},
                ),
                timeout=300,
            )
            for i in range(16)
        ]
        singles = [
            stub.RunRollout(
                env_pb2.RunRolloutRequest(
                    rollout_id=f"single-{i}",
                    plan=plan(inference.address),
                    task={"env": "reverse-text", "split": "train", "idx": 100 + i},
                ),
                timeout=300,
            )
            for i in range(128)
        ]
        replies = await asyncio.gather(*groups, *singles)
    traces = [t for reply in replies for t in reply.traces]
    assert len(traces) == 256
    assert len({t.id for t in traces}) == 256
    for trace in traces:
        assert not trace.errors, trace.errors
        assert trace.stop_condition in (trace_pb2.STOP_CONDITION_COMPLETED, trace_pb2.STOP_CONDITION_LENGTH)
        trace_from_proto(trace)
