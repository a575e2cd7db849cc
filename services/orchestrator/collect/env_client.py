"""Client of one env-server (EnvService): in-process types in and out, the wire
(`rlrun.common.wire.env`) at the boundary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from rlrun.common.grpc_client import ClientOptions, call_while_unavailable, open_channel
from rlrun.common.wire import WireError
from rlrun.common.wire import env as wire
from rlrun.common.wire.env import BranchResult, EnvInfo, RewardRange
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint
from rlrun.common.wire.trace import TaskRef, Trace
from rlrun.v1 import env_pb2_grpc


class EnvClient:
    def __init__(self, address: str, options: ClientOptions, unavailable_retry_s: float = 120.0):
        self.address = address
        self.unavailable_retry_s = unavailable_retry_s
        self.channel = open_channel(address, options)
        self.stub = env_pb2_grpc.EnvServiceStub(self.channel)
        self.reward_range: RewardRange | None = None
        """The env's declared reward range (from describe): every reply is checked against it."""

    async def describe(self, key: str, env_id: str) -> EnvInfo:
        """The GetInfo entry for this env: matched by its key, else by its registry id."""
        by_id = wire.get_info_response_from_proto(await self.stub.GetInfo(wire.get_info_request()))
        entry = by_id.get(key) or by_id.get(env_id)
        if entry is None:
            raise RuntimeError(
                f"env-server {self.address} does not serve env {key!r} (it serves: {', '.join(by_id) or 'nothing'})"
            )
        try:
            info = wire.env_info_from_proto(entry)
        except WireError as error:
            raise RuntimeError(f"env-server {self.address}: {error.message}") from None
        self.reward_range = info.reward_range
        return info

    async def run_group(
        self, group_id: str, task: TaskRef, plan: GenerationPlan, n: int, timeout_s: float
    ) -> list[Trace]:
        """n rollouts of one task; the reply is checked against the request and each trace
        validated (wire.group_from_proto; WireError names the field).

        An env-server that is gone (restarting: it does not answer GetInfo either) is waited
        for, within `grpc.unavailable_retry_s` and `timeout_s`, and the group sent again. An
        UNAVAILABLE from a server that answers is its own verdict on the group, which the
        scheduler's retry policy (orchestrator.max_retries) handles."""
        request = wire.RunGroupRequest(group_id, task, plan, n)
        encoded = wire.run_group_request_to_proto(request)
        reply = await call_while_unavailable(
            lambda: self.stub.RunGroup(encoded, timeout=timeout_s),
            min(self.unavailable_retry_s, timeout_s),
            f"env-server {self.address} RunGroup",
            gone=self._gone,
        )
        return wire.group_from_proto(reply, request, f"RunGroup({group_id})", self.reward_range)

    async def _gone(self) -> bool:
        """Whether the env-server is down (it does not answer GetInfo either)."""
        try:
            await self.stub.GetInfo(wire.get_info_request(), timeout=5.0)
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.UNAVAILABLE
        return False

    async def cancel(self, group_ids: list[str]) -> int:
        return wire.cancel_response_from_proto(
            await self.stub.Cancel(wire.cancel_request_to_proto(group_ids), timeout=10.0)
        )

    async def run_algorithms(
        self,
        env_id: str,
        ids: list[str],
        traces: list[Trace],
        args: dict[str, dict[str, Any]] | None = None,
        models: Sequence[ModelEndpoint] = (),
    ) -> list[BranchResult]:
        """The env's own algorithms over one group, with each one's settings (`args[id]`,
        sent as JSON) and the run's model endpoints."""
        request = wire.RunAlgorithmsRequest(
            env_id, ids, traces, {i: args[i] for i in ids if args and i in args}, list(models)
        )
        reply = await self.stub.RunAlgorithms(wire.run_algorithms_request_to_proto(request))
        return wire.run_algorithms_response_from_proto(reply, f"RunAlgorithms({env_id}).results")

    async def close(self) -> None:
        await self.channel.close()
