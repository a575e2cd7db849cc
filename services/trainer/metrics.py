"""Prometheus metrics of the trainer (`rlrun_trainer_<what>_<unit>`), served by rank 0."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from rlrun.common.metrics import metric_name
from rlrun.common.wire.trainer import BroadcastResult, StepResult

_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

STEP_SECONDS = Histogram(
    metric_name("trainer", "step", "seconds"),
    "Duration of a trained batch (all its optimizer steps).",
    buckets=_SECONDS_BUCKETS,
)
STEPS = Counter(metric_name("trainer", "steps", "total"), "Batches trained.")
SKIPPED_STEPS = Counter(
    metric_name("trainer", "skipped_steps", "total"),
    "Batches skipped for a non-finite loss or gradient norm.",
)
TOKENS = Counter(
    metric_name("trainer", "trained", "tokens_total"), "Tokens of trained batches (once per batch)."
)
THROUGHPUT = Gauge(
    metric_name("trainer", "throughput", "tokens_per_second"),
    "Tokens per second of the last batch, counting each optimizer step over it.",
)
LOSS = Gauge(
    metric_name("trainer", "loss", "value"),
    "Loss of the last batch, per channel (rl, ce) and in total.",
    ["channel"],
)
GRAD_NORM = Gauge(
    metric_name("trainer", "grad_norm", "value"), "Gradient norm (before clipping) of the last batch."
)
POLICY_VERSION = Gauge(
    metric_name("trainer", "policy", "version"), "Policy version of the trainer's weights."
)
BROADCAST_SECONDS = Histogram(
    metric_name("trainer", "weight_broadcast", "seconds"),
    "Duration of a weight broadcast to all replicas.",
    buckets=_SECONDS_BUCKETS,
)
BROADCAST_BYTES = Counter(
    metric_name("trainer", "weight_broadcast", "bytes_total"), "Weight bytes delivered to replicas."
)
BROADCAST_FAILURES = Counter(
    metric_name("trainer", "weight_broadcast_failures", "total"),
    "Replica updates that failed (replica down or rejected the update).",
)
CHECKPOINT_SECONDS = Histogram(
    metric_name("trainer", "checkpoint", "seconds"),
    "Duration of a checkpoint save.",
    buckets=_SECONDS_BUCKETS,
)


def record_step(result: StepResult) -> None:
    if result.skipped:
        SKIPPED_STEPS.inc()
        return
    metrics = result.metrics
    STEPS.inc()
    STEP_SECONDS.observe(metrics["step_seconds"])
    TOKENS.inc(metrics["tokens"])
    THROUGHPUT.set(metrics["tokens_per_second"])
    for channel in ("rl", "ce"):
        LOSS.labels(channel=channel).set(metrics[f"loss_{channel}"])
    LOSS.labels(channel="total").set(metrics["loss"])
    GRAD_NORM.set(metrics["grad_norm"])
    POLICY_VERSION.set(result.version)


def record_broadcast(results: list[BroadcastResult], seconds: float) -> None:
    BROADCAST_SECONDS.observe(seconds)
    for result in results:
        if result.ok:
            BROADCAST_BYTES.inc(result.bytes)
        else:
            BROADCAST_FAILURES.inc()
