"""rl: A = r, no baseline (plain REINFORCE)."""

from __future__ import annotations

from rlrun.orchestrator.algorithms.base import GroupCredit, credit_sampled
from rlrun.orchestrator.algorithms.registry import register
from rlrun.orchestrator.group import RolloutGroup


@register
class Rl(GroupCredit):
    name = "rl"

    def credit(self, group: RolloutGroup) -> None:
        for trace in group.trained_traces:
            credit_sampled(trace, "rl", trace.reward)
