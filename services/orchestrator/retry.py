"""Which rollout failures are retried.

Only infrastructure faults and errors the env marks retryable (invalid model output, a model
call that failed, a timeout) are retried, a bounded number of times. Everything else is a
programming error somewhere and must surface: a non-retryable gRPC status fails the run, and a
trace with a non-retryable error drops its group with the error logged and counted.
"""

from __future__ import annotations

import enum

import grpc

from rlrun.common.types import Trace, TraceError

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class Verdict(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    FAIL = "fail"


def rpc_is_retryable(code: grpc.StatusCode) -> bool:
    return code in RETRYABLE_CODES


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
