"""Runs one rollout group on its env-server under the retry policy (see retry.py); shared by
the training scheduler and the eval. A group that keeps failing comes back as a GroupFailure,
already logged with its env and group id and counted in `groups_failed_total`."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from rlrun.common.wire import WireError
from rlrun.common.wire.plan import GenerationPlan
from rlrun.common.wire.trace import TaskRef, TraceError
from rlrun.orchestrator import metrics
from rlrun.orchestrator.collect.env_client import EnvClient
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.collect.retry import (
    GROUP_FAULT_CODES,
    Verdict,
    classify_traces,
    may_retry,
    rpc_is_retryable,
    trace_errors,
)

log = logging.getLogger(__name__)


class FailureSink(Protocol):
    """Who hears of failing rollouts as they happen (the run's status, which the console shows)."""

    def rollout_failed(self, env: str, task: TaskRef, reason: str) -> None:
        """An attempt at a group of `task` failed (it may still be retried)."""

    def group_failed(self, env: str) -> None:
        """A group was dropped after it kept failing."""

    def group_stale(self, env: str) -> None:
        """A group was dropped as too stale to train."""


@dataclass(frozen=True)
class EnvRollouts:
    """How one env's groups run in a phase: where, with which plan, and who trains."""

    env: str
    client: EnvClient
    plan: GenerationPlan
    trained_members: frozenset[str]
    temperatures: dict[str, float]
    learner_seat_only: bool = False
    """Train only the seat the env marked as the learner's (orchestrator.multi_agent.filter_by_learner_seat)."""
    failures: FailureSink | None = None


@dataclass(frozen=True)
class GroupFailure:
    group_id: str
    env: str
    task: TaskRef
    reason: str
    """The last failure, e.g. `RunGroup INTERNAL: KeyError: 'answer'`."""
    attempts: int
    label: str
    """The kind of failure, as `groups_failed_total` labels it (`internal`, `trace_errors`, ...)."""


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
    """The group's traces, or why it was dropped (retry.py says what is retried). `version()`
    is called as each attempt starts (a retry generates afresh, under the version current
    then). Only a status that no group could pass raises."""
    attempt = 0
    while True:
        attempt += 1
        dispatch_version = version()
        try:
            traces = await target.client.run_group(group_id, task, target.plan, n, timeout_s)
        except grpc.aio.AioRpcError as error:
            code = error.code()
            if not rpc_is_retryable(code):
                raise
            label, reason = code.name.lower(), f"RunGroup {code.name}: {error.details()}"
            loud = code in GROUP_FAULT_CODES
        except WireError as error:
            # A reply that breaks the contract (env.proto's RunGroupResponse): a bug of the
            # env-server, which a retry would only repeat.
            reason = f"invalid reply from env-server {target.client.address}: {error.message}"
            return _dropped(target, group_id, task, attempt, "invalid_trace", reason)
        else:
            verdict = classify_traces(traces)
            if verdict is Verdict.OK:
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
            errors = describe_errors(trace_errors(traces))
            if verdict is Verdict.FAIL:
                return _dropped(
                    target, group_id, task, attempt, "non_retryable_trace_errors", f"trace errors: {errors}"
                )
            label, reason, loud = "trace_errors", f"retryable trace errors: {errors}", False
        if not may_retry(attempt, max_retries):
            return _dropped(target, group_id, task, attempt, label, reason, loud=loud)
        if target.failures is not None:
            target.failures.rollout_failed(target.env, task, reason)
        log.log(
            logging.WARNING if loud else logging.INFO,
            "group %s on env %s: retry %d/%d after %s",
            group_id,
            target.env,
            attempt,
            max_retries,
            reason,
        )
        metrics.ROLLOUT_RETRIES.labels(env=target.env).inc()


def _dropped(
    target: EnvRollouts,
    group_id: str,
    task: TaskRef,
    attempts: int,
    label: str,
    reason: str,
    loud: bool = True,
) -> GroupFailure:
    """Logs and counts a dropped group: at ERROR when the env-server or the env failed it (a bug
    somewhere), at WARNING when only the infrastructure or the model's output did."""
    log.log(
        logging.ERROR if loud else logging.WARNING,
        "group %s on env %s dropped after %d attempt(s): %s",
        group_id,
        target.env,
        attempts,
        reason,
    )
    metrics.GROUPS_FAILED.labels(env=target.env, reason=label).inc()
    if target.failures is not None:
        target.failures.rollout_failed(target.env, task, reason)
        target.failures.group_failed(target.env)
    return GroupFailure(group_id, target.env, task, reason, attempts, label)


def describe_errors(errors: list[TraceError]) -> str:
    """Each distinct error once, with how many rollouts had it: `HarnessError: ... (8 rollouts)`."""
    counts = Counter(f"{e.type}: {e.message}" for e in errors)
    return "; ".join(text + (f" ({n} rollouts)" if n > 1 else "") for text, n in counts.items())
