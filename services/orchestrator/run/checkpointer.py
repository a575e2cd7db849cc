"""The orchestrator's side of checkpoints (docs/resilience.md).

- `resume`: the trainer rolls back to its newest checkpoint at or before the last step this
  run's metrics.jsonl records (none: its newest), and the orchestrator state saved with it is
  loaded (a fresh trainer's step 0 has none: the run starts from `RunContext.initial`).
- `state_after`: the state as it will be once a batch trained, carried by its SubmitBatch, so
  a trainer checkpoint of that step stores the pair.
- `save`: a checkpoint of the current step (end of the warm start, end of the run, a stop).
"""

from __future__ import annotations

import dataclasses
import logging

from rlrun.common.wire.trainer import Resumed
from rlrun.orchestrator.run.context import RunContext
from rlrun.orchestrator.run.outputs import RunOutputs
from rlrun.orchestrator.run.phase import Phase
from rlrun.orchestrator.run.progress import Progress
from rlrun.orchestrator.run.state import OrchestratorState
from rlrun.orchestrator.run.step import BuiltStep, RunFailed
from rlrun.orchestrator.run.trainer_client import TrainerClient

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, trainer: TrainerClient, context: RunContext, progress: Progress, outputs: RunOutputs):
        self.trainer = trainer
        self.context = context
        self.progress = progress
        self.outputs = outputs
        self._saved_at = -1
        """The trainer step of the last checkpoint the run knows of."""

    @property
    def behind(self) -> bool:
        """The trainer has trained steps since the last checkpoint."""
        return self._saved_at != self.progress.trainer_step

    async def resume(self) -> Resumed:
        """Back to the checkpoint this run's records reach; the run's progress, sampler and
        algorithms are that checkpoint's afterwards."""
        back = await self.trainer.rollback(self.outputs.recorded_trainer_step())
        state = self.loaded_state(back)
        self.context.sampler.load_state(state.sampler)
        self.context.credit.load_state_dict(state.algorithms)
        self.progress.restart_from(state)
        self.progress.moved_to(back.step, back.version)
        self._saved_at = back.step
        return back

    def loaded_state(self, back: Resumed) -> OrchestratorState:
        """The orchestrator state of the checkpoint the trainer rolled back to."""
        if back.resume_state:
            state = OrchestratorState.from_bytes(back.resume_state)
        elif back.step == 0:
            state = dataclasses.replace(self.context.initial, policy_version=back.version)
        else:
            raise RunFailed(
                f"the trainer's checkpoint {back.checkpoint or 'at step ' + str(back.step)} holds no "
                "orchestrator state; start the run over with --fresh"
            )
        if state.trainer_step != back.step:
            raise RunFailed(
                f"the trainer is at step {back.step} but the orchestrator state saved with it is for "
                f"step {state.trainer_step}"
            )
        return state

    def state_after(self, built: BuiltStep, phase: Phase) -> OrchestratorState:
        """The state as it will be once `built` trained: what a trainer checkpoint of that
        step saves (the step's wall time is not known yet and is left out)."""
        progress = self.progress
        state = dataclasses.replace(
            progress.state,
            trainer_step=progress.trainer_step + 1,
            policy_version=progress.version + 1,
            sampler=self.context.sampler.state(),
            groups_dropped_stale=progress.groups_dropped_stale(),
        )
        phase.count_step(state, built, step_seconds=0.0)
        return state

    async def save(self) -> None:
        state, step = self.progress.state, self.progress.trainer_step
        state.sampler = self.context.sampler.state()
        state.groups_dropped_stale = self.progress.groups_dropped_stale()
        path = await self.trainer.save_checkpoint(state.to_bytes(), step)
        self._saved_at = step
        log.info("checkpoint at trainer step %d: %s", step, path)
