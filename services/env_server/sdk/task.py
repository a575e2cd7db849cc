"""A task (one example of an environment) and the score of a rollout on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlrun.common.wire.trace import ExampleId, RewardComponent


@dataclass(frozen=True)
class Example:
    """What a taskset generator draws: `key` identifies the example (it decides the split and
    becomes the example id), `data` is JSON-serialisable and holds whatever scoring needs."""

    key: str
    prompt: str
    data: dict[str, Any]
    system: str | None = None


@dataclass(frozen=True)
class Task:
    """One example at a position of a split; what a harness runs and a scorer scores."""

    split: str
    idx: int
    example_id: ExampleId
    prompt: str
    data: dict[str, Any]
    system: str | None = None

    @classmethod
    def from_example(cls, split: str, idx: int, example: Example) -> Task:
        return cls(split, idx, example.key, example.prompt, example.data, example.system)


@dataclass
class Score:
    """Named reward components, each with a weight, plus free-form numeric metrics. The
    rollout's reward is the weighted sum of the components."""

    rewards: dict[str, RewardComponent]
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, score: float, weight: float = 1.0, **metrics: float) -> Score:
        return cls({name: RewardComponent(score, weight)}, dict(metrics))

    @property
    def reward(self) -> float:
        return sum(c.score * c.weight for c in self.rewards.values())


@dataclass
class MemberScores:
    """The scores of one multi-agent episode, one per member. They must cover every member of
    the episode, exactly: a missing member is an error, never a silent zero."""

    scores: dict[str, Score]

    def check_members(self, members: tuple[str, ...]) -> None:
        missing = [m for m in members if m not in self.scores]
        extra = [m for m in self.scores if m not in members]
        if missing or extra:
            raise ValueError(
                f"the member scores cover {sorted(self.scores)} but the episode's members are "
                f"{list(members)} (missing: {missing}, unknown: {extra}); score every member"
            )
