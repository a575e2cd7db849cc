"""sft: cross-entropy on the actor's tokens, typically with a fixed actor (the env's oracle or a
teacher model): the supervised warm start goes through this algorithm."""

from __future__ import annotations

from pydantic import Field

from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import AlgorithmArgs, GroupCredit, credit_sampled
from rlrun.orchestrator.credit.algorithms.registry import register


class SftArgs(AlgorithmArgs):
    weight: float = Field(1.0, gt=0)
    """CE weight of each of the actor's tokens. Default: 1."""


@register
class Sft(GroupCredit):
    name = "sft"
    Args = SftArgs
    handles_members = True  # per-trace, no group statistics: each trained member imitates its actor

    def credit(self, group: RolloutGroup) -> None:
        for trace in group.trained_traces:
            credit_sampled(trace, "ce", self.args.weight)
