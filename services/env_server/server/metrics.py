"""Prometheus metrics of the env-server (`rlrun_env_server_*`); labels are bounded by the
run's env entries, the two splits, the stop conditions and the TraceError types."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from rlrun.common.metrics import metric_name

SERVICE = "env-server"

ROLLOUTS = Counter(
    metric_name(SERVICE, "rollouts", "total"),
    "Rollouts returned, by env, split and stop condition.",
    ["env", "split", "stop_condition"],
)
FAILED_ROLLOUTS = Counter(
    metric_name(SERVICE, "failed_rollouts", "total"),
    "Rollouts returned with at least one error (cancelled ones aside), by env; every env's series "
    "exists from the start (at 0), so error rates and alerts have data on a healthy run.",
    ["env"],
)
ROLLOUT_ERRORS = Counter(
    metric_name(SERVICE, "rollout_errors", "total"),
    "Rollouts returned with an error, by env and error type.",
    ["env", "type", "retryable"],
)
REQUEST_SECONDS = Histogram(
    metric_name(SERVICE, "request_duration", "seconds"),
    "Wall time of a RunGroup or RunRollout request inside its worker.",
    ["env"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
IN_FLIGHT = Gauge(
    metric_name(SERVICE, "in_flight", "rollouts"), "Rollouts running or waiting for a worker.", ["env"]
)
WORKERS = Gauge(metric_name(SERVICE, "pool", "workers"), "Worker processes of the env's pool.", ["env"])
WORKER_ROLLOUTS = Gauge(
    metric_name(SERVICE, "worker", "rollouts"),
    "Rollouts on the env's worker processes: a job whose caller went away counts until its "
    "worker has stopped it.",
    ["env"],
)
CANCELLED = Counter(
    metric_name(SERVICE, "cancelled_rollouts", "total"),
    "Rollouts cancelled through Cancel or by the caller.",
    ["env"],
)


def init_env(env: str) -> None:
    """Creates the env's always-present series at 0 (a labelled counter is otherwise absent
    until its first increment, and a dashboard or alert on it sees no data)."""
    FAILED_ROLLOUTS.labels(env)
    CANCELLED.labels(env)
    WORKER_ROLLOUTS.labels(env)
