"""Client of one env-server (EnvService): proto at the boundary, in-process types inside."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rlrun.common.grpc_client import ClientOptions, call_while_unavailable, open_channel
from rlrun.common.types import TaskRef, Trace
from rlrun.common.wire import channels_from_proto, group_from_proto, task_to_proto, trace_to_proto
from rlrun.orchestrator.credit.algorithms import BranchResult
from rlrun.v1 import env_pb2, env_pb2_grpc, plan_pb2


@dataclass(frozen=True)
class EnvDescription:
    """What GetInfo says about one env."""

    env_id: str
    task_counts: dict[str, int]
    group_scoring: bool
    algorithms: list[str]
    members: list[str]
    temperature: float
    """0: not declared (the run's configured temperature is the one that counts)."""
    tokenizer: plan_pb2.TokenizerInfo | None
    """The tokenizer the env renders ids with, when it declares one."""
    reward_range: env_pb2.RewardRange | None


class EnvClient:
    def __init__(self, address: str, options: ClientOptions, unavailable_retry_s: float = 120.0):
        self.address = address
        self.unavailable_retry_s = unavailable_retry_s
        self.channel = open_channel(address, options)
        self.stub = env_pb2_grpc.EnvServiceStub(self.channel)
        self.reward_range: env_pb2.RewardRange | None = None
        """The env's declared reward range (from describe): every reply is checked against it."""

    async def describe(self, key: str, env_id: str) -> EnvDescription:
        """The GetInfo entry for this env: matched by its key, else by its registry id."""
        reply = await self.stub.GetInfo(env_pb2.GetInfoRequest())
        by_id = {info.env_id: info for info in reply.envs}
        info = by_id.get(key) or by_id.get(env_id)
        if info is None:
            raise RuntimeError(
                f"env-server {self.address} does not serve env {key!r} (it serves: {', '.join(by_id) or 'nothing'})"
            )
        reward_range = info.reward_range if info.HasField("reward_range") else None
        if reward_range is not None and not (
            math.isfinite(reward_range.min)
            and math.isfinite(reward_range.max)
            and reward_range.min <= reward_range.max
        ):
            raise RuntimeError(
                f"env-server {self.address}: env {info.env_id!r} declares reward_range "
                f"[{reward_range.min}, {reward_range.max}]; it needs finite ends with min <= max"
            )
        self.reward_range = reward_range
        return EnvDescription(
            env_id=info.env_id,
            task_counts=dict(info.task_counts),
            group_scoring=info.group_scoring,
            algorithms=list(info.algorithms),
            members=list(info.members),
            temperature=info.temperature,
            tokenizer=info.tokenizer if info.HasField("tokenizer") else None,
            reward_range=reward_range,
        )

    async def run_group(
        self, group_id: str, task: TaskRef, plan: plan_pb2.GenerationPlan, n: int, timeout_s: float
    ) -> list[Trace]:
        """n rollouts of one task; the reply is checked against the request and each trace
        validated (wire.group_from_proto; WireError names the field).

        An env-server that is gone (restarting: it does not answer GetInfo either) is waited
        for, within `grpc.unavailable_retry_s` and `timeout_s`, and the group sent again. An
        UNAVAILABLE from a server that answers is its own verdict on the group, which the
        scheduler's retry policy (orchestrator.max_retries) handles."""
        request = env_pb2.RunGroupRequest(group_id=group_id, task=task_to_proto(task), plan=plan, n=n)
        reply = await call_while_unavailable(
            lambda: self.stub.RunGroup(request, timeout=timeout_s),
            min(self.unavailable_retry_s, timeout_s),
            f"env-server {self.address} RunGroup",
            gone=self._gone,
        )
        return group_from_proto(reply.traces, request, f"RunGroup({group_id})", self.reward_range)

    async def _gone(self) -> bool:
        """Whether the env-server is down (it does not answer GetInfo either)."""
        try:
            await self.stub.GetInfo(env_pb2.GetInfoRequest(), timeout=5.0)
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.UNAVAILABLE
        return False

    async def cancel(self, group_ids: list[str]) -> int:
        reply = await self.stub.Cancel(env_pb2.CancelRequest(group_ids=group_ids), timeout=10.0)
        return reply.cancelled

    async def run_algorithms(
        self,
        env_id: str,
        ids: list[str],
        traces: list[Trace],
        args: dict[str, dict[str, Any]] | None = None,
        models: Sequence[plan_pb2.ModelEndpoint] = (),
    ) -> list[BranchResult]:
        """The env's own algorithms over one group, with each one's settings (`args[id]`,
        sent as JSON) and the run's model endpoints."""
        request = env_pb2.RunAlgorithmsRequest(
            env_id=env_id,
            algorithms=ids,
            traces=[trace_to_proto(t) for t in traces],
            algorithm_args={i: json.dumps(args[i]) for i in ids if args and i in args},
            models=list(models),
        )
        reply = await self.stub.RunAlgorithms(request)
        where = f"RunAlgorithms({env_id}).results"
        return [
            BranchResult(
                trace_id=r.trace_id,
                branch_index=r.branch_index,
                channels=channels_from_proto(r.channels, f"{where}[{i}]"),
                mask=list(r.mask),
            )
            for i, r in enumerate(reply.results)
        ]

    async def close(self) -> None:
        await self.channel.close()
