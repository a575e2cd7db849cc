"""Prometheus metrics of the inference service (`rlrun_inference_*`), shared by every engine."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from rlrun.common.metrics import metric_name

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)

PROMPT_TOKENS = Counter(
    metric_name("inference", "prompt_tokens", "total"), "Prompt tokens prefilled (once per sample)."
)
GENERATED_TOKENS = Counter(metric_name("inference", "generated_tokens", "total"), "Tokens generated.")
STEPS = Counter(
    metric_name("inference", "steps", "total"),
    "Batched forward steps; generated tokens / steps is the mean batch occupancy.",
)
COMPLETIONS = Counter(
    metric_name("inference", "completions", "total"), "Finished samples, by finish reason.", ["finish_reason"]
)
RUNNING = Gauge(
    metric_name("inference", "running", "requests"), "Requests with at least one sample in the batch."
)
WAITING = Gauge(metric_name("inference", "waiting", "requests"), "Requests waiting for a batch slot.")
REQUEST_LATENCY = Histogram(
    metric_name("inference", "request_latency", "seconds"),
    "Generate latency, arrival to last sample finished.",
    buckets=_LATENCY_BUCKETS,
)
TIME_TO_FIRST_TOKEN = Histogram(
    metric_name("inference", "time_to_first_token", "seconds"),
    "Arrival to the first token of a sample.",
    buckets=_LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    metric_name("inference", "inter_token_latency", "seconds"),
    "Mean time between consecutive tokens of a sample (one observation per finished sample).",
    buckets=_TOKEN_BUCKETS,
)
POLICY_VERSION = Gauge(metric_name("inference", "policy", "version"), "Policy version of the served weights.")
WEIGHT_UPDATE_SECONDS = Histogram(
    metric_name("inference", "weight_update", "seconds"),
    "UpdateWeights: first message to the update committed (served from then on).",
    buckets=_LATENCY_BUCKETS,
)
WEIGHT_APPLY_SECONDS = Histogram(
    metric_name("inference", "weight_apply", "seconds"),
    "The engine's copy of a committed update into the model, between two decode steps.",
    buckets=_TOKEN_BUCKETS,
)
WEIGHT_UPDATE_BYTES = Counter(
    metric_name("inference", "weight_update_bytes", "total"), "Weight bytes received."
)
WEIGHT_UPDATE_FAILURES = Counter(
    metric_name("inference", "weight_update_failures", "total"),
    "UpdateWeights calls that left the model unchanged.",
)
