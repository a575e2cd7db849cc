"""A rollout group: the traces of one RunGroup call, with what the orchestrator knew when it
dispatched it. Algorithms, filters and flattening all work on groups."""

from __future__ import annotations

from dataclasses import dataclass

from rlrun.common.types import TaskRef, Trace


@dataclass
class RolloutGroup:
    group_id: str
    env: str
    """Key of the env entry (EnvConfig.key) the group ran on."""
    task: TaskRef
    traces: list[Trace]
    dispatch_version: int
    """Trainer policy version when the group was dispatched (a lower bound of its rollouts' span)."""
    trained_members: frozenset[str]
    """Members whose traces train ("policy" for single-agent runs)."""
    temperatures: dict[str, float]
    """Per member: the sampling temperature fanned out over its samples' tokens (never 0)."""
    attempts: int = 1

    @property
    def trained_traces(self) -> list[Trace]:
        return [t for t in self.traces if t.member_id in self.trained_members]

    @property
    def policy_start(self) -> int:
        """Oldest policy version any trained rollout of the group was generated under."""
        traces = self.trained_traces or self.traces
        return min((t.policy_span[0] for t in traces), default=self.dispatch_version)
