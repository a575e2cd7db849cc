"""What every algorithm is: it reads a rollout group and writes, onto each trained trace's
branches, per-token values in a loss channel (rl or ce) and a per-token train mask.

Several algorithms may run on one group, in order: each appends its channels (channels with
the same loss are summed downstream) and the masks are merged by union, so a token trains
when any algorithm trains it.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from rlrun.common.config import ConfigError
from rlrun.common.errors import describe_validation_error
from rlrun.common.wire.trace import Branch, Channel, LossKind, MessageNode, Trace
from rlrun.orchestrator.collect.group import RolloutGroup


class Scorer(Protocol):
    """Logprobs of given tokens under a model (InferenceService.Score), with a concurrency cap."""

    async def score(self, token_ids: list[int], start: int, temperature: float) -> list[float]:
        """One logprob per token at positions [start, len(token_ids))."""
        ...


@dataclass
class AlgorithmDeps:
    """What an algorithm may need from outside; tests pass fakes."""

    scorer: Callable[[str, int], Scorer] | None = None
    """(model key, max concurrency) -> a scorer for that model target."""
    render_message: Callable[[str, str], list[int]] | None = None
    """(role, text) -> the tokens of one chat message, as the policy's tokenizer renders it."""
    model_concurrency: Callable[[str], int] | None = None
    """model key -> its configured max_concurrency."""


class AlgorithmArgs(BaseModel):
    """Base of every algorithm's `orchestrator.algorithm_args.<id>` table; unknown keys fail."""

    model_config = ConfigDict(extra="forbid")


class Algorithm(abc.ABC):
    name: ClassVar[str]
    Args: ClassVar[type[AlgorithmArgs]] = AlgorithmArgs
    handles_members: ClassVar[bool] = False
    """Whether it is defined for multi-agent groups (per-member traces)."""
    needs_members: ClassVar[bool] = False
    """Whether it is defined only for multi-agent groups (a single-agent env is refused)."""

    def __init__(self, args: dict[str, Any], deps: AlgorithmDeps):
        try:
            self.args = self.Args.model_validate(args)
        except ValidationError as error:
            raise ConfigError(
                f"orchestrator.algorithm_args.{self.name}", describe_validation_error(error)
            ) from None
        self.deps = deps

    @abc.abstractmethod
    async def apply(self, group: RolloutGroup) -> None:
        """Writes channels and masks onto the branches of the group's trained traces."""

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints (e.g. running baselines); stateless algorithms have none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(
                f"algorithm {self.name!r} keeps no state but the checkpoint has some: {sorted(state)}"
            )


class GroupCredit(Algorithm):
    """An algorithm that needs nothing but the group itself: a pure function of its traces."""

    async def apply(self, group: RolloutGroup) -> None:
        self.credit(group)

    @abc.abstractmethod
    def credit(self, group: RolloutGroup) -> None: ...


def branch_nodes(branch: Branch, nodes: dict[str, MessageNode]) -> list[MessageNode]:
    return [nodes[nid] for nid in branch.node_ids]


def observation_tokens(nodes: Sequence[MessageNode]) -> list[bool]:
    """Per token: true on the tokens of nodes the environment returned (tool or user messages)."""
    out: list[bool] = []
    for node in nodes:
        out += [node.is_observation] * len(node.token_ids)
    return out


def sampled_tokens(nodes: Sequence[MessageNode]) -> list[bool]:
    out: list[bool] = []
    for node in nodes:
        out += node.sampled_mask
    return out


def add_credit(branch: Branch, loss: LossKind, values: list[float], mask: list[bool]) -> None:
    """Appends one channel and merges its mask into the branch's by union."""
    branch.channels.append(Channel(loss, values))
    if branch.mask and len(branch.mask) != len(mask):
        raise ValueError(f"a mask of {len(mask)} entries cannot merge into one of {len(branch.mask)}")
    branch.mask = list(map(operator.or_, branch.mask, mask)) if branch.mask else list(mask)


def credit_sampled(trace: Trace, loss: LossKind, weight: float) -> None:
    """`weight` on every sampled token of every branch (0 elsewhere); those tokens train."""
    nodes = trace.node_map()
    for branch in trace.branches:
        sampled = sampled_tokens(branch_nodes(branch, nodes))
        add_credit(branch, loss, [weight if s else 0.0 for s in sampled], sampled)


def group_rewards(group: RolloutGroup) -> tuple[list[Trace], list[float]]:
    traces = group.trained_traces
    return traces, [t.reward for t in traces]
