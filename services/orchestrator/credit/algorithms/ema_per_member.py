"""ema_per_member: role-conditioned advantage estimation (SPIRAL, Algorithm 1).

One baseline per (task, example id, member id), where the task is the env the group ran on. For
each trained trajectory, in order, the baseline moves first and is subtracted second:

    b ← α·b + (1 − α)·R,    A = R − b

so a cold baseline (0) with α = 0.9 and R = 1 gives A = 0.9, and several trajectories with the
same key in one group compound, one update each. Separate baselines per member keep the seats of
a zero-sum game from cancelling each other's signal. The baselines are saved in checkpoints and
are required on resume: a checkpoint without them is an error, never a silent cold start.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlrun.common.wire.trace import ExampleId, Trace
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import AlgorithmArgs, GroupCredit, credit_sampled
from rlrun.orchestrator.credit.algorithms.registry import register

BaselineKey = tuple[str, ExampleId, str]
"""(task: the env key, example id, member id)."""


class EmaPerMemberArgs(AlgorithmArgs):
    alpha: float = Field(0.9, ge=0.0, le=1.0)
    """Decay of the baselines: b ← alpha·b + (1 − alpha)·R. Default: 0.9."""


def baseline_key(env: str, trace: Trace) -> BaselineKey:
    example_id = trace.task.example_id
    if example_id is None:
        raise ValueError(
            f"ema_per_member: trace {trace.id!r} (env {env!r}, task {trace.task.idx}) has no example id "
            "to key its baseline by"
        )
    return (env, example_id, trace.member_id)


def ema_advantage(
    baselines: dict[BaselineKey, float], key: BaselineKey, reward: float, alpha: float
) -> float:
    """Updates the key's baseline with `reward` (0 when the key is new), then returns R − b."""
    baseline = alpha * baselines.get(key, 0.0) + (1.0 - alpha) * reward
    baselines[key] = baseline
    return reward - baseline


@register
class EmaPerMember(GroupCredit):
    name = "ema_per_member"
    Args = EmaPerMemberArgs
    handles_members = True  # a baseline per member: each seat is measured against itself
    # On a single-agent env it would silently be a per-task EMA baseline, which is not what a
    # config naming it asks for (the seed refuses it at startup too).
    needs_members = True

    def __init__(self, args: dict[str, Any], deps):
        super().__init__(args, deps)
        self.baselines: dict[BaselineKey, float] = {}

    def credit(self, group: RolloutGroup) -> None:
        for trace in group.trained_traces:
            key = baseline_key(group.env, trace)
            credit_sampled(trace, "rl", ema_advantage(self.baselines, key, trace.reward, self.args.alpha))

    def state_dict(self) -> dict[str, Any]:
        # A list of [env, example id, member, baseline] rows: JSON keeps an int example id an int
        # and a str one a str, which object keys would not.
        return {
            "baselines": [[env, example, member, b] for (env, example, member), b in self.baselines.items()]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "baselines" not in state:
            raise ValueError(
                "ema_per_member: the checkpoint holds no saved baselines (was it saved by a run without "
                "ema_per_member?); resuming would silently restart every baseline cold. Resume from a "
                "checkpoint of this run, or start a fresh run"
            )
        self.baselines = {(env, example, member): float(b) for env, example, member, b in state["baselines"]}
