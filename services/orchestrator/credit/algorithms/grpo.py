"""grpo: A = r - mean(r) over the group, optionally divided by the group's std (+ eps)."""

from __future__ import annotations

import numpy as np

from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import (
    AlgorithmArgs,
    GroupCredit,
    credit_sampled,
    group_rewards,
)
from rlrun.orchestrator.credit.algorithms.registry import register


class GrpoArgs(AlgorithmArgs):
    std_normalize: bool = False
    """Divide by the group's (population) reward std plus `eps`. Default: false."""
    eps: float = 1e-6
    """Added to the std before dividing. Default: 1e-6."""


def group_advantages(rewards: list[float], std_normalize: bool, eps: float) -> list[float]:
    r = np.asarray(rewards, dtype=np.float64)
    advantages = r - r.mean()
    if std_normalize:
        advantages = advantages / (r.std() + eps)
    return advantages.tolist()


@register
class Grpo(GroupCredit):
    name = "grpo"
    Args = GrpoArgs

    def credit(self, group: RolloutGroup) -> None:
        traces, rewards = group_rewards(group)
        for trace, advantage in zip(
            traces, group_advantages(rewards, self.args.std_normalize, self.args.eps), strict=True
        ):
            credit_sampled(trace, "rl", advantage)
