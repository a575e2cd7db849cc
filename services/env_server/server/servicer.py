"""The EnvService gRPC shell: request validation and conversion around the env hosts.

Bad input (unknown env, split or algorithm, task index out of range, invalid plan or
sampling, n <= 0, malformed traces) gets INVALID_ARGUMENT naming the field; a failed
rollout is a trace with `errors`; INTERNAL means a bug of this server.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc

from rlrun.common.errors import RequestError, grpc_errors
from rlrun.common.wire import _channels_to_proto, plan_from_proto, trace_from_proto
from rlrun.env_server.server.host import EnvHost
from rlrun.env_server.server.rollout import RolloutJob
from rlrun.v1 import env_pb2, env_pb2_grpc

SERVICE_NAME = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name

DEADLINE_MARGIN = 0.05
"""Share of the caller's remaining deadline kept back, so a timed-out rollout's trace still
reaches the caller before its deadline does; at least MIN_MARGIN_S, at most MAX_MARGIN_S."""
MIN_MARGIN_S, MAX_MARGIN_S = 0.25, 5.0


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, hosts: dict[str, EnvHost], default_timeout_s: float):
        self.hosts = hosts
        self.default_timeout_s = default_timeout_s

    def _host(self, key: str, where: str) -> EnvHost:
        host = self.hosts.get(key)
        if host is None:
            raise RequestError(where, f"this env-server hosts no env {key!r}; it hosts {sorted(self.hosts)}")
        return host

    def _timeout(self, context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return self.default_timeout_s
        margin = min(MAX_MARGIN_S, max(MIN_MARGIN_S, DEADLINE_MARGIN * remaining))
        return min(self.default_timeout_s, max(0.001, remaining - margin))

    def _job(self, request, rollout_ids: list[str], group_id: str) -> tuple[EnvHost, RolloutJob]:
        host = self._host(request.task.env, "task.env")
        task = host.task(request.task)
        plan = plan_from_proto(request.plan, "plan")
        host.check_plan(plan)
        return host, RolloutJob(host.key, task, plan, group_id, rollout_ids)

    @grpc_errors
    async def GetInfo(self, request, context):
        return env_pb2.GetInfoResponse(envs=[host.info() for host in self.hosts.values()])

    @grpc_errors
    async def RunRollout(self, request, context):
        rollout_id = request.rollout_id or uuid.uuid4().hex
        host, job = self._job(request, [rollout_id], request.group_id)
        return await host.run(job, self._timeout(context), env_pb2.RunRolloutResponse)

    @grpc_errors
    async def RunGroup(self, request, context):
        if request.n <= 0:
            raise RequestError("n", f"n must be positive, got {request.n}")
        group_id = request.group_id or uuid.uuid4().hex
        host, job = self._job(request, [f"{group_id}/{i}" for i in range(request.n)], group_id)
        return await host.run(job, self._timeout(context), env_pb2.RunGroupResponse)

    @grpc_errors
    async def RunAlgorithms(self, request, context):
        host = self._host(request.env_id, "env_id")
        host.check_algorithms(list(request.algorithms))
        traces = [trace_from_proto(t, f"traces[{i}]") for i, t in enumerate(request.traces)]
        args = _algorithm_args(request.algorithm_args)
        models = {m.name: list(m.addresses) for m in request.models if m.addresses}
        results = await host.run_algorithms(list(request.algorithms), traces, args, models)
        return env_pb2.RunAlgorithmsResponse(
            results=[
                env_pb2.BranchResult(
                    trace_id=r.trace_id,
                    branch_index=r.branch_index,
                    channels=_channels_to_proto(r.channels),
                    mask=r.mask,
                )
                for r in results
            ]
        )

    @grpc_errors
    async def Cancel(self, request, context):
        groups, rollouts = set(request.group_ids), set(request.rollout_ids)
        return env_pb2.CancelResponse(cancelled=sum(h.cancel(groups, rollouts) for h in self.hosts.values()))


def _algorithm_args(raw) -> dict[str, dict[str, Any]]:
    """RunAlgorithmsRequest.algorithm_args: algorithm id -> a JSON object."""
    out: dict[str, dict[str, Any]] = {}
    for algorithm_id, text in raw.items():
        try:
            value = json.loads(text) if text else {}
        except json.JSONDecodeError as error:
            raise RequestError(f"algorithm_args[{algorithm_id}]", f"is not JSON: {error}") from None
        if not isinstance(value, dict):
            raise RequestError(f"algorithm_args[{algorithm_id}]", "must be a JSON object")
        out[algorithm_id] = value
    return out
