"""The env-server contract as the orchestrator enforces it (proto/rlrun/v1/env.proto), in real
runs against fake env-servers on 127.0.0.1: a reply that breaks it fails its group naming the
field, the env and the group, and never ends the run; readiness needs GetInfo, not
grpc.health.v1; a declared tokenizer or temperature that disagrees with the run fails its
start; every plan sent carries the model's tokenizer and end tokens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time

import grpc
import pytest

from rlrun.common.config import resolve_config
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.common.wire.plan import tokenizer_info_from_proto, tokenizer_info_to_proto
from rlrun.orchestrator.run.run import Run
from rlrun.v1 import env_pb2, env_pb2_grpc

from .conftest import FakeEnv

ENV = "reverse-text"
BROKEN_GROUP = 1
"""Dispatch index of the RL group whose reply each case breaks."""


async def execute(config, timeout: float = 60):
    status = RunStatus()
    await asyncio.wait_for(Run(config, status).execute(), timeout=timeout)
    return status


def _drop_a_trace(reply):
    del reply.traces[-1]


def _clear(field):
    return lambda reply: reply.traces[0].ClearField(field)


def _set(field, value):
    return lambda reply: setattr(reply.traces[0], field, value)


def _task_idx(reply):
    reply.traces[0].task.idx += 1


CASES = {
    "missing branches": (_clear("branches"), r"traces\[0\]\.branches is empty"),
    "missing policy_span": (_clear("policy_span"), r"traces\[0\]\.policy_span is unset"),
    "empty member_id": (_set("member_id", ""), r"traces\[0\]\.member_id '' names no plan target"),
    "wrong n": (_drop_a_trace, r"traces has 1 traces of member 'policy' for n = 2 rollouts"),
    "NaN reward": (_set("reward", math.nan), r"traces\[0\]\.reward is nan, not a finite number"),
    "reward outside the declared range": (
        _set("reward", 1.5),
        r"traces\[0\]\.reward 1\.5 is outside the env's reward_range \[0\.0, 1\.0\]",
    ),
    "group id not echoed": (
        _set("group_id", "another"),
        r"traces\[0\]\.group_id 'another' is not the requested",
    ),
    "task not echoed": (_task_idx, r"traces\[0\]\.task\.idx \d+ is not the requested \d+"),
}


class BreakingEnv(FakeEnv):
    """FakeEnv whose reply for group BROKEN_GROUP is broken by `breaks` (every attempt)."""

    def __init__(self, env: FakeEnv, breaks):
        super().__init__(env.trainer)
        self.info.reward_range.CopyFrom(env_pb2.RewardRange(min=0.0, max=1.0))
        self.breaks = breaks

    async def RunGroup(self, request, context):
        reply = await super().RunGroup(request, context)
        if request.group_id.endswith(f"-{BROKEN_GROUP:06d}"):
            self.breaks(reply)
        return reply


@contextlib.asynccontextmanager
async def bare_env_server(servicer):
    """`servicer` (None: nothing) on a bare grpc.aio server on 127.0.0.1: no grpc.health.v1, no
    reflection, as an env-server in another language may well be."""
    server = grpc.aio.server()
    if servicer is not None:
        env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def run_file(stack, tmp_path, env_address, **orchestrator):
    raw = stack.raw(tmp_path, eval={"enabled": False}, **orchestrator)
    raw["orchestrator"]["train"]["env"][0]["address"] = env_address
    return resolve_config(raw)[0]


@pytest.mark.parametrize("case", list(CASES))
async def test_a_reply_that_breaks_the_contract_fails_its_group_naming_field_env_and_group(
    stack, tmp_path, caplog, case
):
    breaks, expected = CASES[case]
    env = BreakingEnv(stack.env, breaks)
    async with bare_env_server(env) as address:
        with caplog.at_level(logging.ERROR, logger="rlrun.orchestrator.collect.rollouts"):
            status = await execute(run_file(stack, tmp_path, address))
    assert status.phase == "succeeded", status.last_error
    [drop] = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(
        rf"group (rl-\w+-t0-{BROKEN_GROUP:06d}) on env {ENV} dropped after 1 attempt\(s\): "
        rf"invalid reply from env-server {re.escape(address)}: RunGroup\(\1\)\.{expected}.*",
        drop,
    ), drop
    # every step still trained a full batch, from the groups that kept the contract
    assert [len(b.samples) for b in stack.trainer.batches] == [4, 4, 4, 4]


async def test_an_env_server_without_the_health_service_is_ready_by_get_info(stack, tmp_path):
    async with bare_env_server(stack.env) as address:
        status = await execute(run_file(stack, tmp_path, address))
    assert status.phase == "succeeded", status.last_error


async def test_a_server_without_env_service_fails_the_start_at_once_naming_the_rpc(stack, tmp_path):
    async with bare_env_server(None) as address:
        started = time.monotonic()
        status = await execute(run_file(stack, tmp_path, address, startup_timeout_s=300.0))
    assert time.monotonic() - started < 10
    assert status.phase == "failed"
    assert (
        f"env-server {ENV} is not ready: {address} answers UNIMPLEMENTED to rlrun.v1.EnvService/GetInfo"
        in status.last_error
    ), status.last_error


async def test_every_plan_carries_the_served_tokenizer_and_its_end_tokens(stack, tmp_path):
    status = await execute(stack.config(tmp_path))
    assert status.phase == "succeeded", status.last_error
    served = stack.inference.tokenizer
    assert served.stop_token_ids  # the char tokenizer's <|end|>
    for call in stack.env.calls:
        assert tokenizer_info_from_proto(call.plan.tokenizer) == served
        assert list(call.plan.text_addresses) == [stack.addresses["inference"]]
        for target in call.plan.targets:
            assert set(served.stop_token_ids) <= set(target.sampling.stop_token_ids)


async def test_a_declared_tokenizer_other_than_the_served_one_fails_the_start(stack, tmp_path):
    stack.env.info.tokenizer.name = "char:lowercase"
    status = await execute(stack.config(tmp_path))
    assert status.phase == "failed"
    assert re.fullmatch(
        rf"orchestrator\.train\.env\.0: env '{ENV}' at \S+ renders token ids with tokenizer "
        r"char:lowercase .* but the model serves char:char .*"
        r"\(name 'char:lowercase' != 'char:char'\)",
        status.last_error,
    ), status.last_error
    assert stack.env.calls == []
    # The same tokenizer, declared by name and hash, starts.
    stack.env.info.tokenizer.CopyFrom(tokenizer_info_to_proto(stack.inference.tokenizer))
    assert (await execute(stack.config(tmp_path / "again"))).phase == "succeeded"


async def test_a_declared_temperature_that_would_skew_the_importance_ratio_fails_the_start(stack, tmp_path):
    stack.env.info.temperature = 0.5
    status = await execute(stack.config(tmp_path))
    assert status.phase == "failed"
    assert status.last_error.startswith(
        f"orchestrator.train.env.0: env '{ENV}' declares temperature 0.5 (EnvInfo.temperature) but the "
        "run samples at 1, the temperature the trainer recomputes logprobs at"
    ), status.last_error
    assert stack.env.calls == []
