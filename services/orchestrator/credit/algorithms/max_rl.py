"""max_rl: A = (r - mean) / mean when the group's mean reward is positive, else 0.

Dividing by the mean scales updates up for hard tasks (few successes) and down for easy ones.
"""

from __future__ import annotations

import numpy as np

from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import GroupCredit, credit_sampled, group_rewards
from rlrun.orchestrator.credit.algorithms.registry import register


def max_rl_advantages(rewards: list[float]) -> list[float]:
    r = np.asarray(rewards, dtype=np.float64)
    mean = r.mean()
    if mean <= 0:
        return [0.0] * len(rewards)
    return ((r - mean) / mean).tolist()


@register
class MaxRl(GroupCredit):
    name = "max_rl"

    def credit(self, group: RolloutGroup) -> None:
        traces, rewards = group_rewards(group)
        for trace, advantage in zip(traces, max_rl_advantages(rewards), strict=True):
            credit_sampled(trace, "rl", advantage)
