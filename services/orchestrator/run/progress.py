"""Where the run stands: the one owner of the trainer step and the policy version.

The step and version live in the orchestrator state (the part of a checkpoint the orchestrator
saves), so what a checkpoint stores is always what the run last knew; everything else reads
them from here.
"""

from __future__ import annotations

from typing import Protocol

from rlrun.orchestrator.run.state import OrchestratorState


class CountsStale(Protocol):
    @property
    def dropped_stale(self) -> int: ...


class Progress:
    def __init__(self, state: OrchestratorState | None = None):
        self.state = state or OrchestratorState(trainer_step=0, policy_version=0)
        self._stale_before = self.state.groups_dropped_stale
        """Groups dropped stale by the phases that ended (and before the checkpoint)."""
        self._live: CountsStale | None = None
        """The scheduler of the phase that is running, if any."""

    @property
    def trainer_step(self) -> int:
        return self.state.trainer_step

    @property
    def version(self) -> int:
        return self.state.policy_version

    def moved_to(self, step: int, version: int) -> None:
        """The trainer answered: it is at `step`, serving `version`."""
        self.state.trainer_step, self.state.policy_version = step, version

    def restart_from(self, state: OrchestratorState) -> None:
        """The run went back to a checkpoint whose orchestrator state is `state`."""
        self.state = state
        self._stale_before = state.groups_dropped_stale
        self._live = None

    def groups_dropped_stale(self) -> int:
        return self._stale_before + (self._live.dropped_stale if self._live is not None else 0)

    def phase_started(self, scheduler: CountsStale) -> None:
        self._live = scheduler

    def phase_ended(self, scheduler: CountsStale) -> None:
        self._stale_before += scheduler.dropped_stale
        self.state.groups_dropped_stale = self._stale_before
        self._live = None
