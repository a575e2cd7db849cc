"""An environment: a taskset, a harness and a scorer (with an optional group-scoring hook),
plus optionally a reference solution and algorithms of its own."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from rlrun.common.wire.plan import PlanTarget
from rlrun.common.wire.trace import Trace
from rlrun.env_server.sdk.algorithms import EnvAlgorithm
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.multi_agent import MultiAgentEpisode
from rlrun.env_server.sdk.sandbox import SandboxRuntime
from rlrun.env_server.sdk.task import MemberScores, Score, Task
from rlrun.env_server.sdk.taskset import Taskset

if TYPE_CHECKING:
    from rlrun.env_server.server.rollout import RolloutJob, Runtime


class Environment(ABC):
    """Subclasses set `taskset` and `harness` in `__init__(**args)`, where `args` are the env
    entry's `args` from the run config. Construction must be cheap and free of downloads: the
    env-server builds one instance in its main process and one in every worker."""

    taskset: Taskset
    harness: Harness

    runtime: SandboxRuntime | None = None
    """Where the env's episodes run commands (rlrun.env_server.sdk.sandbox): an env that needs
    one builds its default; an env entry's `runtime = {type = ...}` replaces it."""

    members: tuple[str, ...] = ()
    """Member ids of a multi-agent env; empty for single-agent envs (one member, `policy`). A
    multi-agent env's harness drives MultiAgentEpisodes (e.g. TurnHarness), its rollouts need a
    plan with one target per member, and its scorer returns MemberScores covering every member."""

    @abstractmethod
    def score(self, task: Task, episode: Episode) -> Score | MemberScores:
        """Scores one finished episode (never called for an episode that failed)."""

    def score_group(self, task: Task, episodes: list[Episode]) -> list[Score | MemberScores]:
        """Scores the finished episodes of one group together; override for group scoring
        (rankings, diversity bonuses, ...). The default scores each on its own."""
        return [self.score(task, episode) for episode in episodes]

    @property
    def group_scoring(self) -> bool:
        return type(self).score_group is not Environment.score_group

    def reference_answer(self, task: Task) -> str:
        """The env's own solution of `task`: the text a rule-kind plan target (the warm start's
        `oracle`) answers with. Envs without one cannot serve rule targets."""
        raise NotImplementedError(f"{type(self).__name__} has no reference answer")

    @property
    def has_reference_answer(self) -> bool:
        return type(self).reference_answer is not Environment.reference_answer

    def member_prompt(self, task: Task, member: str) -> tuple[str, str | None]:
        """The opening user message and system message (or None) of `member`'s conversation in
        a multi-agent episode. Default: the task's own, for every member."""
        return task.prompt, task.system

    def rule_reply(self, task: Task, episode: MultiAgentEpisode, member: str, target: PlanTarget) -> str:
        """What a rule-kind plan target says when it plays `member` at this point of a
        multi-agent episode (its own view: `episode.conversations[member]`, the public record:
        `episode.public`). Multi-agent envs without rules cannot serve rule targets."""
        raise NotImplementedError(f"{type(self).__name__} has no rule-based members")

    @property
    def has_rule_reply(self) -> bool:
        return type(self).rule_reply is not Environment.rule_reply

    def algorithms(self) -> dict[str, EnvAlgorithm]:
        """Env-owned algorithms by id (run through RunAlgorithms). Default: none."""
        return {}

    async def run_job(
        self, job: RolloutJob, runtime: Runtime, timeout_s: float, cancelled: asyncio.Event
    ) -> list[Trace] | None:
        """Runs a whole rollout job with rollout machinery of the env's own (a verifiers env)
        and returns its validated traces, or None to leave the job to the harness. Default:
        None."""
        return None
