"""Retry classification: which failures are retried, and how many times."""

from __future__ import annotations

import grpc

from rlrun.orchestrator.retry import Verdict, classify_traces, may_retry, rpc_is_retryable


def test_only_unavailable_and_deadline_exceeded_are_retryable_statuses():
    assert rpc_is_retryable(grpc.StatusCode.UNAVAILABLE)
    assert rpc_is_retryable(grpc.StatusCode.DEADLINE_EXCEEDED)
    for code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    ):
        assert not rpc_is_retryable(code), code


def test_traces_are_retried_only_when_every_error_is_retryable(build):
    ok = build.trace("ok")
    flaky = build.trace("flaky", errors=[("ModelCallError", "replica restarting", True)])
    broken = build.trace("broken", errors=[("HarnessError", "KeyError: 'x'", False)])
    assert classify_traces([ok, ok]) is Verdict.OK
    assert classify_traces([ok, flaky]) is Verdict.RETRY
    assert classify_traces([flaky, broken]) is Verdict.FAIL


def test_retries_are_bounded():
    assert [may_retry(attempt, max_retries=2) for attempt in (1, 2, 3)] == [True, True, False]
    assert not may_retry(1, max_retries=0)
