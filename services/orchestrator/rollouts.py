"""Runs one rollout group on its env-server under the retry policy (see retry.py); shared by
the training scheduler and the eval."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rlrun.common.types import TaskRef, WireError
from rlrun.orchestrator import metrics
from rlrun.orchestrator.env_client import EnvClient
from rlrun.orchestrator.group import RolloutGroup
from rlrun.orchestrator.retry import Verdict, classify_traces, may_retry, rpc_is_retryable, trace_errors
from rlrun.v1 import plan_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvRollouts:
    """How one env's groups run in a phase: where, with which plan, and who trains."""

    env: str
    client: EnvClient
    plan: plan_pb2.GenerationPlan
    trained_members: frozenset[str]
    temperatures: dict[str, float]
    learner_seat_only: bool = False
    """Train only the seat the env marked as the learner's (orchestrator.multi_agent.filter_by_learner_seat)."""


@dataclass(frozen=True)
class GroupFailure:
    group_id: str
    env: str
    task: TaskRef
    reason: str
    exhausted: bool
    """True when retryable failures ran out of retries; False for a non-retryable error."""


async def run_group(
    target: EnvRollouts,
    group_id: str,
    task: TaskRef,
    n: int,
    *,
    version: Callable[[], int],
    max_retries: int,
    timeout_s: float,
) -> RolloutGroup | GroupFailure:
    """The group's traces, or why it was dropped. `version()` is called as each attempt starts
    (a retry generates afresh, under the version current then). A non-retryable gRPC status
    raises: it is a bug in this request or in the env-server, and the run must not go on as if
    nothing happened."""
    attempt = 0
    while True:
        attempt += 1
        dispatch_version = version()
        try:
            traces = await target.client.run_group(group_id, task, target.plan, n, timeout_s)
        except grpc.aio.AioRpcError as error:
            if not rpc_is_retryable(error.code()):
                raise
            reason = f"RunGroup {error.code().name}: {error.details()}"
        except WireError as error:
            log.error(
                "group %s on env %s returned an invalid trace, dropped: %s", group_id, target.env, error
            )
            metrics.GROUPS_FAILED.labels(env=target.env, reason="invalid_trace").inc()
            return GroupFailure(group_id, target.env, task, f"invalid trace: {error}", exhausted=False)
        else:
            verdict = classify_traces(traces)
            if verdict is Verdict.OK:
                if not traces:
                    raise RuntimeError(
                        f"env-server {target.client.address} returned no traces for group {group_id}"
                    )
                return RolloutGroup(
                    group_id=group_id,
                    env=target.env,
                    task=task,
                    traces=traces,
                    dispatch_version=dispatch_version,
                    trained_members=target.trained_members,
                    temperatures=target.temperatures,
                    attempts=attempt,
                    learner_seat_only=target.learner_seat_only,
                )
            errors = "; ".join(f"{e.type}: {e.message}" for e in trace_errors(traces))
            if verdict is Verdict.FAIL:
                log.error(
                    "group %s on env %s failed with a non-retryable error, dropped: %s",
                    group_id,
                    target.env,
                    errors,
                )
                metrics.GROUPS_FAILED.labels(env=target.env, reason="error").inc()
                return GroupFailure(group_id, target.env, task, errors, exhausted=False)
            reason = f"retryable trace errors: {errors}"
        if not may_retry(attempt, max_retries):
            log.warning(
                "group %s on env %s dropped after %d attempts: %s", group_id, target.env, attempt, reason
            )
            metrics.GROUPS_FAILED.labels(env=target.env, reason="retries_exhausted").inc()
            return GroupFailure(group_id, target.env, task, reason, exhausted=True)
        log.info(
            "group %s on env %s: retry %d/%d after %s", group_id, target.env, attempt, max_retries, reason
        )
        metrics.ROLLOUT_RETRIES.labels(env=target.env).inc()
