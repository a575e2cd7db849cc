"""echo: grpo on the sampled tokens, plus a CE weight on the observation tokens the environment
returned (tool results and user feedback alike), so the model also learns to predict them."""

from __future__ import annotations

from pydantic import Field

from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import (
    GroupCredit,
    add_credit,
    branch_nodes,
    group_rewards,
    observation_tokens,
    sampled_tokens,
)
from rlrun.orchestrator.credit.algorithms.grpo import GrpoArgs, group_advantages
from rlrun.orchestrator.credit.algorithms.registry import register


class EchoArgs(GrpoArgs):
    observation_weight: float = Field(1.0, gt=0)
    """CE weight of each observation token. Default: 1."""


@register
class Echo(GroupCredit):
    name = "echo"
    Args = EchoArgs

    def credit(self, group: RolloutGroup) -> None:
        traces, rewards = group_rewards(group)
        advantages = group_advantages(rewards, self.args.std_normalize, self.args.eps)
        weight = self.args.observation_weight
        for trace, advantage in zip(traces, advantages, strict=True):
            nodes = trace.node_map()
            for branch in trace.branches:
                path = branch_nodes(branch, nodes)
                sampled = sampled_tokens(path)
                observed = observation_tokens(path)
                add_credit(branch, "rl", [advantage if s else 0.0 for s in sampled], sampled)
                add_credit(branch, "ce", [weight if o else 0.0 for o in observed], observed)
