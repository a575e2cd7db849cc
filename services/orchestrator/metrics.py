"""Prometheus metrics of the orchestrator, `rlrun_orchestrator_<what>_<unit>`. Labels are
bounded: `env` takes the configured env keys, `filter` the filter names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from rlrun.common.metrics import metric_name

if TYPE_CHECKING:
    from rlrun.common.config import RunConfig


def _name(what: str, unit: str) -> str:
    return metric_name("orchestrator", what, unit)


RL_STEPS = Gauge(_name("rl", "steps"), "RL steps completed (trainer batches of the RL phase).")
WARMUP_STEPS = Gauge(_name("warmup", "steps"), "Warm-start steps completed.")
POLICY_VERSION = Gauge(_name("policy", "version"), "Policy version of the trainer after the last step.")
TRAIN_REWARD = Gauge(_name("train_reward", "mean"), "Mean reward of the last RL batch's rollouts.")
EVAL_REWARD = Gauge(_name("eval_reward", "mean"), "Mean reward of the last eval (or warm-start dev check).")
ADVANTAGE_MEAN = Gauge(
    _name("advantage", "mean"), "Mean rl-channel advantage over the last batch's trained tokens."
)
ADVANTAGE_STD = Gauge(
    _name("advantage", "std"), "Std of the rl-channel advantage over the last batch's trained tokens."
)
ADVANTAGE_ABS_MAX = Gauge(_name("advantage_abs", "max"), "Largest |advantage| in the last batch.")
OFF_POLICY = Histogram(
    _name("off_policy", "steps"),
    "Versions between a trained group's rollouts and the trainer version it trained at.",
    buckets=(0, 1, 2, 3, 4, 6, 8, 16),
)
MAX_OFF_POLICY = Gauge(
    _name("max_off_policy", "steps"),
    "The run's staleness bound (orchestrator.max_off_policy_steps) that off_policy_steps is held to.",
)
GROUPS_DROPPED_STALE = Counter(
    _name("groups_dropped_stale", "total"), "Groups dropped whole as too stale.", ["env"]
)
GROUPS_FAILED = Counter(
    _name("groups_failed", "total"),
    "Groups dropped after a rollout failure, by the last one: a RunGroup status (internal, "
    "invalid_argument, unknown, unavailable, deadline_exceeded), trace_errors (retryable, out of "
    "retries), non_retryable_trace_errors or invalid_trace.",
    ["env", "reason"],
)
ROLLOUT_RETRIES = Counter(
    _name("rollout_retries", "total"), "Group retries after a retryable failure.", ["env"]
)
ROLLOUTS = Counter(
    _name("rollouts", "total"), "Trained-member rollouts received, filtered ones included.", ["env"]
)
FILTERED = Counter(_name("filtered_rollouts", "total"), "Rollouts flagged by a filter.", ["filter", "env"])
FILTERED_RATIO = Gauge(
    _name("filtered", "ratio"), "Fraction of the last batch's rollouts that filters kept from training."
)
QUEUE_DEPTH = Gauge(_name("queue_depth", "groups"), "Finished groups waiting to join a batch.")
INFLIGHT = Gauge(_name("inflight", "groups"), "Groups being generated.")
BATCH_BUILD = Histogram(
    _name("batch_build", "seconds"), "Algorithms, filters, flattening and proto building of one batch."
)
STEP_SECONDS = Histogram(
    _name("step", "seconds"),
    "Wall time between consecutive trainer steps.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
GENERATED_TOKENS = Counter(_name("generated", "tokens_total"), "Tokens sampled in trained-member rollouts.")
TOKENS_PER_SECOND = Gauge(
    _name("throughput", "tokens_per_second"), "Sampled tokens per second over the last step."
)
EMPTY_BATCHES = Counter(
    _name("empty_batches", "total"), "Batches regenerated because every rollout was filtered."
)
SKIPPED_STEPS = Counter(_name("skipped_steps", "total"), "Steps the trainer skipped (non-finite loss).")


def init_run(config: RunConfig) -> None:
    """At start: the staleness bound, and every train env's labelled series at 0 (a labelled
    counter is otherwise absent until its first increment, and a dashboard or alert on it sees
    no data on a healthy run)."""
    MAX_OFF_POLICY.set(config.orchestrator.max_off_policy_steps)
    for env in config.orchestrator.train.env:
        for counter in (GROUPS_DROPPED_STALE, ROLLOUT_RETRIES, ROLLOUTS):
            counter.labels(env=env.key)
