"""The EnvService gRPC shell: request validation and conversion around the env hosts.

Bad input (unknown env, split or algorithm, task index out of range, invalid plan or
sampling, n <= 0 or above limits.max_group_size, malformed traces) gets INVALID_ARGUMENT
naming the field, before any work starts; a failed
rollout is a trace with `errors`; INTERNAL means a bug of this server.
"""

from __future__ import annotations

import uuid

import grpc

from rlrun.common.errors import RequestError, grpc_errors
from rlrun.common.wire import env as wire
from rlrun.common.wire.limits import RequestLimits
from rlrun.env_server.server.host import EnvHost
from rlrun.env_server.server.rollout import RolloutJob
from rlrun.v1 import env_pb2_grpc

SERVICE_NAME = wire.SERVICE_NAME

DEADLINE_MARGIN = 0.05
"""Share of the caller's remaining deadline kept back, so a timed-out rollout's trace still
reaches the caller before its deadline does; at least MIN_MARGIN_S, at most MAX_MARGIN_S."""
MIN_MARGIN_S, MAX_MARGIN_S = 0.25, 5.0


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, hosts: dict[str, EnvHost], default_timeout_s: float, limits: RequestLimits):
        self.hosts = hosts
        self.default_timeout_s = default_timeout_s
        self.limits = limits
        self.vocab_sizes = {key: host.vocab_size for key, host in hosts.items()}
        """Per hosted env, the vocabulary its plans' stop tokens must lie in."""
        self.members = {key: max(1, len(host.env.members)) for key, host in hosts.items()}
        """Per hosted env, its members (a group carries up to max_group_size traces of each)."""

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

    def _job(
        self, request: wire.RunGroupRequest, rollout_ids: list[str], group_id: str
    ) -> tuple[EnvHost, RolloutJob]:
        host = self._host(request.task.env, "task.env")
        task = host.task(request.task)
        host.check_plan(request.plan)
        return host, RolloutJob(host.key, task, request.plan, group_id, rollout_ids)

    @grpc_errors
    async def GetInfo(self, request, context):
        return wire.get_info_response_to_proto([host.info() for host in self.hosts.values()])

    @grpc_errors
    async def RunRollout(self, request, context):
        asked = wire.run_rollout_request_from_proto(request, self.vocab_sizes)
        rollout_id = asked.rollout_id or uuid.uuid4().hex
        host, job = self._job(asked, [rollout_id], asked.group_id)
        return wire.run_rollout_response_to_proto(await host.run(job, self._timeout(context)))

    @grpc_errors
    async def RunGroup(self, request, context):
        asked = wire.run_group_request_from_proto(request, self.limits, self.vocab_sizes)
        group_id = asked.group_id or uuid.uuid4().hex
        host, job = self._job(asked, [f"{group_id}/{i}" for i in range(asked.n)], group_id)
        return wire.run_group_response_to_proto(await host.run(job, self._timeout(context)))

    @grpc_errors
    async def RunAlgorithms(self, request, context):
        asked = wire.run_algorithms_request_from_proto(request, self.limits, self.members)
        host = self._host(asked.env_id, "env_id")
        host.check_algorithms(asked.algorithms)
        models = {m.name: list(m.addresses) for m in asked.models if m.addresses}
        results = await host.run_algorithms(asked.algorithms, asked.traces, asked.algorithm_args, models)
        return wire.run_algorithms_response_to_proto(results)

    @grpc_errors
    async def Cancel(self, request, context):
        groups, rollouts = wire.cancel_request_from_proto(request)
        return wire.cancel_response_to_proto(sum(h.cancel(groups, rollouts) for h in self.hosts.values()))
