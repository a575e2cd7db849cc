"""A rollout group: the traces of one RunGroup call, with what the orchestrator knew when it
dispatched it. Algorithms, filters and flattening all work on groups."""

from __future__ import annotations

from dataclasses import dataclass

from rlrun.common.wire.trace import TaskRef, Trace

LEARNER_SEAT = "learner_seat"
"""Trace info key under which a multi-agent env marks the seat the learner played."""


def learner_seat(trace: Trace) -> str:
    """The seat the env marked as the learner's in this trace's rollout; an error without one."""
    seat = trace.info.get(LEARNER_SEAT)
    if not seat:
        raise ValueError(
            f"trace {trace.id!r} (env {trace.task.env!r}) has no `{LEARNER_SEAT}` in its info, but "
            "orchestrator.multi_agent.filter_by_learner_seat is on; the env must mark the learner's "
            "seat, or turn the filter off"
        )
    return seat


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
    learner_seat_only: bool = False
    """Of the trained members, only the seat the env marked as the learner's trains."""

    def trains(self, trace: Trace) -> bool:
        if trace.member_id not in self.trained_members:
            return False
        return not self.learner_seat_only or learner_seat(trace) == trace.member_id

    @property
    def trained_traces(self) -> list[Trace]:
        return [t for t in self.traces if self.trains(t)]

    @property
    def policy_start(self) -> int:
        """Oldest policy version any trained rollout of the group was generated under."""
        traces = self.trained_traces or self.traces
        return min((t.policy_span[0] for t in traces), default=self.dispatch_version)
