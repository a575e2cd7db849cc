"""rlrun/v1/env.proto: the EnvService's messages in process, validated."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rlrun.common.wire import WireError
from rlrun.common.wire.trace import Trace, trace_from_proto
from rlrun.v1 import env_pb2, trace_pb2


def group_from_proto(
    msgs: Sequence[trace_pb2.Trace],
    request: env_pb2.RunGroupRequest,
    where: str,
    reward_range: env_pb2.RewardRange | None = None,
) -> list[Trace]:
    """The traces of a RunGroup reply, checked against the request (env.proto's
    RunGroupResponse): n traces per plan target, the group and the task echoed, a member id
    that names a target, branches and a policy span on every trace without errors, each
    trace's own invariants, and rewards within the env's declared range."""
    members = [t.member_id for t in request.plan.targets]
    counts: Counter[str] = Counter()
    traces = []
    for i, msg in enumerate(msgs):
        at = f"{where}.traces[{i}]"
        if msg.group_id != request.group_id:
            raise WireError(
                f"{at}.group_id", f"{at}.group_id {msg.group_id!r} is not the requested {request.group_id!r}"
            )
        for name in ("env", "split", "idx"):
            got, asked = getattr(msg.task, name), getattr(request.task, name)
            if got != asked:
                raise WireError(
                    f"{at}.task.{name}", f"{at}.task.{name} {got!r} is not the requested {asked!r}"
                )
        if msg.member_id not in members:
            raise WireError(
                f"{at}.member_id",
                f"{at}.member_id {msg.member_id!r} names no plan target (targets: {', '.join(members)})",
            )
        if not msg.errors:
            if not msg.branches:
                raise WireError(
                    f"{at}.branches",
                    f"{at}.branches is empty: a trace without errors needs a branch (node ids, root to leaf) to train on",
                )
            if not msg.HasField("policy_span"):
                raise WireError(
                    f"{at}.policy_span",
                    f"{at}.policy_span is unset: a trace without errors needs the policy versions "
                    "of its sampled tokens ({0, 0} without a model call)",
                )
        trace = trace_from_proto(msg, at)
        if reward_range is not None and not reward_range.min <= trace.reward <= reward_range.max:
            raise WireError(
                f"{at}.reward",
                f"{at}.reward {trace.reward} is outside the env's reward_range "
                f"[{reward_range.min}, {reward_range.max}]",
            )
        counts[msg.member_id] += 1
        traces.append(trace)
    for member in members:
        if counts[member] != request.n:
            raise WireError(
                f"{where}.traces",
                f"{where}.traces has {counts[member]} traces of member {member!r} for n = {request.n} rollouts",
            )
    return traces
