"""Credited groups to one training batch: filters, flattening and the batch's metrics.

Rewards and filter rates cover every rollout of the trained members (filtered ones included:
they count, they just never train). A rollout the always-on out_of_vocabulary check flags is
also logged, naming its env, group and field. An empty result (every rollout filtered) is
returned as such; the run loop regenerates it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import compress

import numpy as np

from rlrun.common.wire.training import TrainingSample
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.filters import RolloutFilters
from rlrun.orchestrator.credit.flatten import flatten_trace

log = logging.getLogger(__name__)

LOW_TRAIN_FRACTION = 0.1
"""At or below this fraction of rollouts training, the run logs a warning."""


@dataclass
class BuiltBatch:
    samples: list[TrainingSample]
    groups: list[RolloutGroup]
    metrics: dict[str, float] = field(default_factory=dict)
    rollouts: int = 0
    trained_rollouts: int = 0
    generated_tokens: int = 0
    flagged: dict[tuple[str, str], int] = field(default_factory=dict)
    """(filter, env) -> rollouts the filter flagged."""
    flags: dict[str, list[str]] = field(default_factory=dict)
    """Trace id -> the filters that flagged it (enforced or monitored), for the rollout dumps."""
    filtered: set[str] = field(default_factory=set)
    """Ids of the traces an enforced filter kept from training."""

    @property
    def policy_start(self) -> int:
        return min(group.policy_start for group in self.groups)

    @property
    def trained_fraction(self) -> float:
        return self.trained_rollouts / self.rollouts if self.rollouts else 0.0


def build_batch(groups: list[RolloutGroup], filters: RolloutFilters) -> BuiltBatch:
    samples: list[TrainingSample] = []
    rewards: list[float] = []
    env_rewards: dict[str, list[float]] = defaultdict(list)
    env_filtered: dict[str, int] = defaultdict(int)
    flagged: dict[tuple[str, str], int] = defaultdict(int)
    flags: dict[str, list[str]] = {}
    filtered_ids: set[str] = set()
    components: dict[str, list[float]] = defaultdict(list)
    rollouts = trained = generated = truncated = filtered = 0
    for group in groups:
        for trace in group.trained_traces:
            rollouts += 1
            rewards.append(trace.reward)
            env_rewards[group.env].append(trace.reward)
            for name, component in trace.rewards.items():
                components[name].append(component.score)
            generated += sum(node.num_sampled for node in trace.nodes)
            truncated += trace.is_truncated
            hits = filters.check(trace)
            if hits:
                flags[trace.id] = [hit.name for hit in hits]
            for hit in hits:
                flagged[(hit.name, group.env)] += 1
                if hit.detail:
                    log.warning(
                        "env %s, group %s: trace %s never trains (%s): %s",
                        group.env,
                        group.group_id,
                        trace.id,
                        hit.name,
                        hit.detail,
                    )
            if any(hit.enforced for hit in hits):
                filtered_ids.add(trace.id)
                filtered += 1
                env_filtered[group.env] += 1
                continue
            trace_samples = flatten_trace(trace, group.temperatures[trace.member_id])
            trained += bool(trace_samples)
            samples += trace_samples
    batch = BuiltBatch(
        samples,
        groups,
        rollouts=rollouts,
        trained_rollouts=trained,
        generated_tokens=generated,
        flagged=dict(flagged),
        flags=flags,
        filtered=filtered_ids,
    )
    batch.metrics = _metrics(
        batch, filters.names, rewards, env_rewards, env_filtered, components, truncated, filtered
    )
    return batch


def _stats(prefix: str, values: list[float] | np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {}
    array = np.asarray(values, dtype=np.float64)
    return {
        f"{prefix}_mean": float(array.mean()),
        f"{prefix}_std": float(array.std()),
        f"{prefix}_min": float(array.min()),
        f"{prefix}_max": float(array.max()),
    }


def _metrics(
    batch: BuiltBatch, filter_names, rewards, env_rewards, env_filtered, components, truncated, filtered
) -> dict[str, float]:
    n = max(batch.rollouts, 1)
    trained_tokens = sum(sum(s.mask) for s in batch.samples)
    advantages = [
        value
        for sample in batch.samples
        for channel in sample.channels
        if channel.loss == "rl"
        for value in compress(channel.values, sample.mask)
    ]
    metrics: dict[str, float] = {
        "rollouts": float(batch.rollouts),
        "groups": float(len(batch.groups)),
        "samples": float(len(batch.samples)),
        "tokens": float(batch.generated_tokens),
        "trained_tokens": float(trained_tokens),
        "trained_fraction": batch.trained_fraction,
        "filtered_ratio": filtered / n,
        "truncated_ratio": truncated / n,
        **_stats("reward", rewards),
        **_stats("advantage", advantages),
    }
    # The configured filters report in every batch; a built-in one (out_of_vocabulary) when it flagged.
    for name in dict.fromkeys([*filter_names, *(name for name, _ in batch.flagged)]):
        metrics[f"filter/{name}_ratio"] = sum(c for (f, _), c in batch.flagged.items() if f == name) / n
    for env, values in env_rewards.items():
        metrics[f"env/{env}/reward_mean"] = float(np.mean(values))
        metrics[f"env/{env}/filtered_ratio"] = env_filtered[env] / len(values)
    for name, values in components.items():
        metrics[f"reward/{name}"] = float(np.mean(values))
    return metrics
