"""rl: A = r, no baseline (plain REINFORCE)."""

from __future__ import annotations

from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import GroupCredit, credit_sampled
from rlrun.orchestrator.credit.algorithms.registry import register


@register
class Rl(GroupCredit):
    name = "rl"

    def credit(self, group: RolloutGroup) -> None:
        for trace in group.trained_traces:
            credit_sampled(trace, "rl", trace.reward)
