"""Retry classification, retry bounds, and the failure rate that stops a run. Which gRPC
statuses drop a group and which fail the run is tested against a real server, in
tests/integration/orchestrator/test_failed_groups.py."""

from __future__ import annotations

from rlrun.orchestrator.collect.retry import FailureRate, Verdict, classify_traces, may_retry


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


def test_the_failure_rate_is_sustained_at_a_share_of_each_envs_recent_groups():
    rate = FailureRate(window=4, max_ratio=0.5)  # 2 failures among an env's last 4 groups
    outcomes = [True, False, False, False, False, True]
    assert [rate.record("a", failed) for failed in outcomes] == [False] * 6  # the first has left the window
    assert not rate.record("b", True)  # another env's failure counts for that env only
    assert rate.record("a", True)
    assert rate.describe("a") == (
        "2 of env 'a''s last 4 finished groups failed "
        "(orchestrator.group_failures: max_ratio 0.5 over a window of 4)"
    )


def test_a_window_need_not_be_full_and_a_ratio_of_one_wants_every_group_failed():
    early = FailureRate(window=64, max_ratio=0.5)
    assert [early.record("a", True) for _ in range(32)] == [False] * 31 + [True]
    strict = FailureRate(window=3, max_ratio=1.0)
    assert [strict.record("a", failed) for failed in (True, True, False, True, True, True)] == [
        False,
        False,
        False,
        False,
        False,
        True,
    ]
