"""Which rollout failures are retried, and when failed groups stop the run.

A failed group is data, not the end of the run: it is retried a bounded number of times
(orchestrator.max_retries), then dropped, logged with its env and group id, and counted. That
covers infrastructure faults (UNAVAILABLE, DEADLINE_EXCEEDED), an env-server failing this one
group (INTERNAL, UNKNOWN: a harness bug hit by this task or by this model output;
INVALID_ARGUMENT: a request for this group it refused, say a task its dataset lacks) and
traces whose errors the env marks retryable (invalid model output, a model call that failed, a
timeout). A retry samples afresh, so a group that broke on one model output may well pass the
next time.

Programming errors still surface loudly, in two ways. A bug that hits single groups is logged
at ERROR on every drop, and once it hits a sustained share of an env's groups
(orchestrator.group_failures) the run stops naming the env and the last error (FailureRate).
A status that says the wiring itself is wrong for every group (UNIMPLEMENTED, NOT_FOUND,
PERMISSION_DENIED, FAILED_PRECONDITION, ...) fails the run at once. A trace with an error the
env marks non-retryable is not retried: its group is dropped and counted.
"""

from __future__ import annotations

import enum
import math
from collections import deque

import grpc

from rlrun.common.wire.trace import Trace, TraceError

INFRASTRUCTURE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
GROUP_FAULT_CODES = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INVALID_ARGUMENT}
)
"""The env-server failed this one group (UNKNOWN is what a servicer that raised answers)."""


class Verdict(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    FAIL = "fail"


def rpc_is_retryable(code: grpc.StatusCode) -> bool:
    """Whether a RunGroup status fails just this group (retried, then dropped); any other
    status fails the run."""
    return code in INFRASTRUCTURE_CODES or code in GROUP_FAULT_CODES


def trace_errors(traces: list[Trace]) -> list[TraceError]:
    return [error for trace in traces for error in trace.errors]


def classify_traces(traces: list[Trace]) -> Verdict:
    """OK without errors; RETRY when every error is retryable; FAIL when any is not."""
    errors = trace_errors(traces)
    if not errors:
        return Verdict.OK
    return Verdict.RETRY if all(e.retryable for e in errors) else Verdict.FAIL


def may_retry(attempt: int, max_retries: int) -> bool:
    """Whether another attempt may follow failed attempt number `attempt` (the first try is 1)."""
    return attempt <= max_retries


class FailureRate:
    """Per env, whether each of its last `window` finished groups failed. The rate is
    sustained once `ceil(max_ratio * window)` of them failed: a window need not be full, so an
    env that fails every group stops the run after that many groups, while one early failure
    never does. Each env has its own window, so one broken env among healthy ones is caught."""

    def __init__(self, window: int, max_ratio: float):
        self.window = window
        self.max_ratio = max_ratio
        self.limit = math.ceil(max_ratio * window)
        self._recent: dict[str, deque[bool]] = {}

    def record(self, env: str, failed: bool) -> bool:
        """Records one finished group of `env`; True when its failure rate is now sustained."""
        recent = self._recent.setdefault(env, deque(maxlen=self.window))
        recent.append(failed)
        return sum(recent) >= self.limit

    def describe(self, env: str) -> str:
        recent = self._recent.get(env, ())
        return (
            f"{sum(recent)} of env {env!r}'s last {len(recent)} finished groups failed "
            f"(orchestrator.group_failures: max_ratio {self.max_ratio} over a window of {self.window})"
        )
