"""rlrun/v1/env.proto: the EnvService's messages in process, shared by the env-server's
servicer and the orchestrator's client, validated."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlrun.common.wire import WireError
from rlrun.common.wire.limits import RequestLimits
from rlrun.common.wire.plan import (
    GenerationPlan,
    ModelEndpoint,
    TokenizerInfo,
    endpoint_from_proto,
    endpoint_to_proto,
    plan_from_proto,
    plan_to_proto,
    tokenizer_info_from_proto,
    tokenizer_info_to_proto,
)
from rlrun.common.wire.trace import (
    STOP_FROM_PB,
    STOP_TO_PB,
    Channel,
    StopCondition,
    TaskRef,
    Trace,
    TraceError,
    channels_from_proto,
    channels_to_proto,
    task_from_proto,
    task_to_proto,
    trace_from_proto,
    trace_to_proto,
    validate_dims,
)
from rlrun.v1 import env_pb2, trace_pb2

SERVICE_NAME = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name


# ---- GetInfo ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardRange:
    min: float
    max: float


@dataclass(frozen=True)
class EnvInfo:
    """One env an env-server hosts (GetInfo)."""

    env_id: str
    task_counts: dict[str, int]
    group_scoring: bool = False
    algorithms: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    temperature: float = 0.0
    """0: not declared (the run's configured temperature is the one that counts)."""
    tokenizer: TokenizerInfo | None = None
    """The tokenizer the env renders ids with, when it declares one."""
    reward_range: RewardRange | None = None


def get_info_request() -> env_pb2.GetInfoRequest:
    return env_pb2.GetInfoRequest()


def env_info_to_proto(info: EnvInfo) -> env_pb2.EnvInfo:
    msg = env_pb2.EnvInfo(
        env_id=info.env_id,
        task_counts=info.task_counts,
        group_scoring=info.group_scoring,
        algorithms=info.algorithms,
        members=info.members,
        temperature=info.temperature,
    )
    if info.tokenizer is not None:
        msg.tokenizer.CopyFrom(tokenizer_info_to_proto(info.tokenizer))
    if info.reward_range is not None:
        msg.reward_range.CopyFrom(env_pb2.RewardRange(min=info.reward_range.min, max=info.reward_range.max))
    return msg


def get_info_response_to_proto(envs: Sequence[EnvInfo]) -> env_pb2.GetInfoResponse:
    return env_pb2.GetInfoResponse(envs=[env_info_to_proto(e) for e in envs])


def env_info_from_proto(msg: env_pb2.EnvInfo, where: str = "env") -> EnvInfo:
    """A declared reward range needs finite ends with min <= max."""
    reward_range = None
    if msg.HasField("reward_range"):
        reward_range = RewardRange(msg.reward_range.min, msg.reward_range.max)
        if not (
            math.isfinite(reward_range.min)
            and math.isfinite(reward_range.max)
            and reward_range.min <= reward_range.max
        ):
            raise WireError(
                f"{where}.reward_range",
                f"env {msg.env_id!r} declares reward_range [{reward_range.min}, {reward_range.max}]; "
                "it needs finite ends with min <= max",
            )
    return EnvInfo(
        env_id=msg.env_id,
        task_counts=dict(msg.task_counts),
        group_scoring=msg.group_scoring,
        algorithms=list(msg.algorithms),
        members=list(msg.members),
        temperature=msg.temperature,
        tokenizer=tokenizer_info_from_proto(msg.tokenizer) if msg.HasField("tokenizer") else None,
        reward_range=reward_range,
    )


def get_info_response_from_proto(msg: env_pb2.GetInfoResponse) -> dict[str, env_pb2.EnvInfo]:
    """The hosted envs by id, unparsed: a client parses the one it uses (`env_info_from_proto`),
    so another env's broken entry does not fail it."""
    return {info.env_id: info for info in msg.envs}


# ---- RunRollout, RunGroup ---------------------------------------------------------------


@dataclass
class RunGroupRequest:
    """RunGroup: n rollouts of one task. RunRollout is the same with n = 1 and the rollout's id."""

    group_id: str
    task: TaskRef
    plan: GenerationPlan
    n: int = 1
    rollout_id: str = ""
    """RunRollout only."""


def run_group_request_to_proto(request: RunGroupRequest) -> env_pb2.RunGroupRequest:
    return env_pb2.RunGroupRequest(
        group_id=request.group_id,
        task=task_to_proto(request.task),
        plan=plan_to_proto(request.plan),
        n=request.n,
    )


def _rollout_request(msg, vocab_sizes: Mapping[str, int]) -> RunGroupRequest:
    plan = plan_from_proto(msg.plan, "plan", vocab_size=vocab_sizes.get(msg.task.env))
    return RunGroupRequest(msg.group_id, task_from_proto(msg.task), plan)


def run_group_request_from_proto(
    msg: env_pb2.RunGroupRequest, limits: RequestLimits, vocab_sizes: Mapping[str, int] = {}
) -> RunGroupRequest:
    """`vocab_sizes`: per hosted env, the vocabulary every stop token of its plans must lie in
    (the server checks the env itself); `n` within `limits.max_group_size`, checked first."""
    if msg.n <= 0:
        raise WireError("n", f"n must be positive, got {msg.n}")
    limits.check("n", msg.n, "max_group_size", "rollouts")
    request = _rollout_request(msg, vocab_sizes)
    request.n = msg.n
    return request


def run_rollout_request_from_proto(
    msg: env_pb2.RunRolloutRequest, vocab_sizes: Mapping[str, int] = {}
) -> RunGroupRequest:
    request = _rollout_request(msg, vocab_sizes)
    request.rollout_id = msg.rollout_id
    return request


@dataclass(frozen=True)
class TraceSummary:
    """What the env-server logs and counts of one trace it returns."""

    rollout_id: str
    member_id: str
    reward: float
    stop_condition: StopCondition
    errors: list[TraceError]
    total_s: float


@dataclass(frozen=True)
class EncodedTraces:
    """A rollout job's traces as encoded once, by the pool worker that ran them: the server
    passes them on as they are (RunRollout's and RunGroup's replies share the encoding)."""

    data: bytes

    def summaries(self) -> list[TraceSummary]:
        return [
            TraceSummary(
                t.rollout_id,
                t.member_id,
                t.reward,
                STOP_FROM_PB.get(t.stop_condition, ""),
                [TraceError(e.type, e.message, e.retryable) for e in t.errors],
                t.timing.total_s,
            )
            for t in env_pb2.RunGroupResponse.FromString(self.data).traces
        ]


def encode_traces(traces: Sequence[Trace]) -> EncodedTraces:
    return EncodedTraces(
        env_pb2.RunGroupResponse(traces=[trace_to_proto(t) for t in traces]).SerializeToString()
    )


def run_group_response_to_proto(traces: EncodedTraces) -> env_pb2.RunGroupResponse:
    return env_pb2.RunGroupResponse.FromString(traces.data)


def run_rollout_response_to_proto(traces: EncodedTraces) -> env_pb2.RunRolloutResponse:
    return env_pb2.RunRolloutResponse.FromString(traces.data)


def stop_condition_name(stop: StopCondition) -> str:
    """The proto's name of a stop condition (`STOP_CONDITION_COMPLETED`), as the env logs write it."""
    return trace_pb2.StopCondition.Name(STOP_TO_PB[stop])


def group_from_proto(
    msg: env_pb2.RunGroupResponse,
    request: RunGroupRequest,
    where: str,
    reward_range: RewardRange | None = None,
) -> list[Trace]:
    """The traces of a RunGroup reply, checked against the request (env.proto's
    RunGroupResponse): n traces per plan target, the group and the task echoed, a member id
    that names a target, branches and a policy span on every trace without errors, each
    trace's own invariants, and rewards within the env's declared range."""
    members = list(request.plan.targets)
    counts: Counter[str] = Counter()
    traces = []
    for i, trace_msg in enumerate(msg.traces):
        at = f"{where}.traces[{i}]"
        if trace_msg.group_id != request.group_id:
            raise WireError(
                f"{at}.group_id",
                f"{at}.group_id {trace_msg.group_id!r} is not the requested {request.group_id!r}",
            )
        for name in ("env", "split", "idx"):
            got, asked = getattr(trace_msg.task, name), getattr(request.task, name)
            if got != asked:
                raise WireError(
                    f"{at}.task.{name}", f"{at}.task.{name} {got!r} is not the requested {asked!r}"
                )
        if trace_msg.member_id not in members:
            raise WireError(
                f"{at}.member_id",
                f"{at}.member_id {trace_msg.member_id!r} names no plan target (targets: {', '.join(members)})",
            )
        if not trace_msg.errors:
            if not trace_msg.branches:
                raise WireError(
                    f"{at}.branches",
                    f"{at}.branches is empty: a trace without errors needs a branch (node ids, root to leaf) to train on",
                )
            if not trace_msg.HasField("policy_span"):
                raise WireError(
                    f"{at}.policy_span",
                    f"{at}.policy_span is unset: a trace without errors needs the policy versions "
                    "of its sampled tokens ({0, 0} without a model call)",
                )
        trace = trace_from_proto(trace_msg, at)
        if reward_range is not None and not reward_range.min <= trace.reward <= reward_range.max:
            raise WireError(
                f"{at}.reward",
                f"{at}.reward {trace.reward} is outside the env's reward_range "
                f"[{reward_range.min}, {reward_range.max}]",
            )
        counts[trace_msg.member_id] += 1
        traces.append(trace)
    for member in members:
        if counts[member] != request.n:
            raise WireError(
                f"{where}.traces",
                f"{where}.traces has {counts[member]} traces of member {member!r} for n = {request.n} rollouts",
            )
    return traces


# ---- RunAlgorithms ----------------------------------------------------------------------


@dataclass
class BranchResult:
    """An env-owned algorithm's credit for one branch."""

    trace_id: str
    branch_index: int
    channels: list[Channel]
    """One value per branch token in each channel."""
    mask: list[bool]
    """Per branch token, true where the token trains."""


def check_branch_results(
    results: Sequence[BranchResult], traces: Sequence[Trace], where: str = "results"
) -> None:
    """Each result names a branch of the group's traces and has one mask entry and one finite
    value per channel per token of it (a malformed result is the env's bug)."""
    by_id = {trace.id: trace for trace in traces}
    for i, result in enumerate(results):
        at = f"{where}[{i}]"
        trace = by_id.get(result.trace_id)
        if trace is None:
            raise WireError(
                f"{at}.trace_id", f"{at}.trace_id {result.trace_id!r} names no trace of the group"
            )
        if not 0 <= result.branch_index < len(trace.branches):
            raise WireError(
                f"{at}.branch_index",
                f"{at}.branch_index {result.branch_index} is out of range: trace {trace.id!r} has {len(trace.branches)} branches",
            )
        if not result.mask:
            raise WireError(f"{at}.mask", f"{at}.mask is empty; it needs one entry per branch token")
        length = trace.branch_length(result.branch_index)
        validate_dims(at, length, result.mask, result.channels, length_name="the branch")


@dataclass
class RunAlgorithmsRequest:
    env_id: str
    algorithms: list[str]
    traces: list[Trace]
    algorithm_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per algorithm id, its settings (a JSON object on the wire)."""
    models: list[ModelEndpoint] = field(default_factory=list)


def run_algorithms_request_to_proto(request: RunAlgorithmsRequest) -> env_pb2.RunAlgorithmsRequest:
    return env_pb2.RunAlgorithmsRequest(
        env_id=request.env_id,
        algorithms=request.algorithms,
        traces=[trace_to_proto(t) for t in request.traces],
        algorithm_args={i: json.dumps(a) for i, a in request.algorithm_args.items()},
        models=[endpoint_to_proto(m) for m in request.models],
    )


def run_algorithms_request_from_proto(
    msg: env_pb2.RunAlgorithmsRequest, limits: RequestLimits, members: Mapping[str, int] = {}
) -> RunAlgorithmsRequest:
    """One group's traces: at most `limits.max_group_size` per member (`members`: per hosted
    env, how many it has; one for an env not listed), checked before any trace is read."""
    per_member = -(-len(msg.traces) // members.get(msg.env_id, 1))
    limits.check("traces", per_member, "max_group_size", "traces per member")
    args: dict[str, dict[str, Any]] = {}
    for algorithm_id, text in msg.algorithm_args.items():
        try:
            value = json.loads(text) if text else {}
        except json.JSONDecodeError as error:
            raise WireError(f"algorithm_args[{algorithm_id}]", f"is not JSON: {error}") from None
        if not isinstance(value, dict):
            raise WireError(f"algorithm_args[{algorithm_id}]", "must be a JSON object")
        args[algorithm_id] = value
    return RunAlgorithmsRequest(
        env_id=msg.env_id,
        algorithms=list(msg.algorithms),
        traces=[trace_from_proto(t, f"traces[{i}]") for i, t in enumerate(msg.traces)],
        algorithm_args=args,
        models=[endpoint_from_proto(m, f"models[{i}]") for i, m in enumerate(msg.models)],
    )


def run_algorithms_response_to_proto(results: Sequence[BranchResult]) -> env_pb2.RunAlgorithmsResponse:
    return env_pb2.RunAlgorithmsResponse(
        results=[
            env_pb2.BranchResult(
                trace_id=r.trace_id,
                branch_index=r.branch_index,
                channels=channels_to_proto(r.channels),
                mask=r.mask,
            )
            for r in results
        ]
    )


def run_algorithms_response_from_proto(msg: env_pb2.RunAlgorithmsResponse, where: str) -> list[BranchResult]:
    return [
        BranchResult(
            trace_id=r.trace_id,
            branch_index=r.branch_index,
            channels=channels_from_proto(r.channels, f"{where}[{i}]"),
            mask=list(r.mask),
        )
        for i, r in enumerate(msg.results)
    ]


# ---- Cancel -----------------------------------------------------------------------------


def cancel_request_to_proto(
    group_ids: Sequence[str], rollout_ids: Sequence[str] = ()
) -> env_pb2.CancelRequest:
    return env_pb2.CancelRequest(group_ids=group_ids, rollout_ids=rollout_ids)


def cancel_request_from_proto(msg: env_pb2.CancelRequest) -> tuple[set[str], set[str]]:
    """(group ids, rollout ids)."""
    return set(msg.group_ids), set(msg.rollout_ids)


def cancel_response_to_proto(cancelled: int) -> env_pb2.CancelResponse:
    return env_pb2.CancelResponse(cancelled=cancelled)


def cancel_response_from_proto(msg: env_pb2.CancelResponse) -> int:
    return msg.cancelled
