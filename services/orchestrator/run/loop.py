"""The step loop of a phase, the same for the warm start and RL: the scheduler produces
groups, the phase's algorithms credit them, filters and flattening cut a batch, and the
trainer trains it. The batch of step n+1 is collected while step n trains (when staleness
allows it); step numbers and versions are stamped on a batch only when it is submitted, so a
step the trainer skips is simply taken again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from rlrun.common.wire.training import encode_batch
from rlrun.orchestrator import metrics
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.collect.scheduler import GroupScheduler
from rlrun.orchestrator.credit.batching import build_batch
from rlrun.orchestrator.credit.filters import RolloutFilters
from rlrun.orchestrator.run.checkpointer import Checkpointer
from rlrun.orchestrator.run.evaluator import Evaluator
from rlrun.orchestrator.run.phase import Phase
from rlrun.orchestrator.run.progress import Progress
from rlrun.orchestrator.run.recorder import Recorder
from rlrun.orchestrator.run.step import BuiltStep, RunFailed, RunStopped, StepOutcome
from rlrun.orchestrator.run.trainer_client import TrainerClient

log = logging.getLogger(__name__)

MAX_BATCH_ATTEMPTS = 3
"""Attempts at a batch whose every rollout was filtered before the run fails."""
MAX_SKIPS_IN_A_ROW = 3
"""Consecutive steps the trainer may skip (non-finite loss) before the run fails."""

SchedulerFactory = Callable[[Phase], GroupScheduler]


class StepLoop:
    def __init__(
        self,
        trainer: TrainerClient,
        progress: Progress,
        filters: RolloutFilters,
        checkpointer: Checkpointer,
        evaluator: Evaluator,
        recorder: Recorder,
        new_scheduler: SchedulerFactory,
        stop: asyncio.Event,
    ):
        self.trainer = trainer
        self.progress = progress
        self.filters = filters
        self.checkpointer = checkpointer
        self.evaluator = evaluator
        self.recorder = recorder
        self.new_scheduler = new_scheduler
        self.stop = stop
        self._skips_in_a_row = 0
        self._last_step_end = 0.0

    def _more(self, phase: Phase, pending: bool) -> bool:
        return phase.more_to_take(self.progress.state, pending) and not self.stop.is_set()

    async def run(self, phase: Phase) -> None:
        """Trains the phase until its steps are done, its evals end it, or a stop."""
        scheduler = self.new_scheduler(phase)
        self.progress.phase_started(scheduler)
        scheduler.start(self.progress.version)
        pending: asyncio.Task[StepOutcome] | None = None
        self._last_step_end = time.monotonic()
        try:
            while True:
                built = None
                if self._more(phase, pending is not None):
                    target = self.progress.version + (pending is not None)
                    try:
                        built = await self._collect(scheduler, phase, target, training=pending)
                    except RunStopped:
                        built = None
                if pending is not None:
                    outcome, pending = await pending, None
                    if await self._after_step(phase, outcome, scheduler):
                        break
                if built is None:
                    if self._more(phase, False):
                        continue  # the trainer skipped a step: take it again
                    break
                pending = asyncio.create_task(self._train(built, phase, scheduler))
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await scheduler.close()
            self.progress.phase_ended(scheduler)

    async def _take(
        self, scheduler: GroupScheduler, training: asyncio.Task[StepOutcome] | None
    ) -> RolloutGroup:
        """The next group; raises RunStopped on Stop, and the training step's error as soon as it
        fails (a synchronous run would otherwise wait for groups that are never dispatched)."""
        take = asyncio.ensure_future(scheduler.take())
        stop = asyncio.ensure_future(self.stop.wait())
        watched: set[asyncio.Future] = {take, stop} | ({training} if training is not None else set())
        try:
            while True:
                done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                if take in done:
                    return take.result()
                if stop in done:
                    raise RunStopped
                if training is not None and training in done:
                    training.result()  # raises the step's error, if any
                    watched.discard(training)
        finally:
            stop.cancel()
            if not take.done():
                take.cancel()
                await asyncio.gather(take, return_exceptions=True)

    async def _collect(
        self,
        scheduler: GroupScheduler,
        phase: Phase,
        target: int,
        training: asyncio.Task[StepOutcome] | None,
    ) -> BuiltStep:
        rates = ""
        rollouts = 0
        for attempt in range(1, MAX_BATCH_ATTEMPTS + 1):
            scheduler.begin_batch(target)
            started = time.monotonic()
            credit_seconds = 0.0
            groups: list[RolloutGroup] = []
            while len(groups) < phase.settings.batch_size:
                group = await self._take(scheduler, training)
                credit_started = time.monotonic()
                await phase.credit.apply(group)
                credit_seconds += time.monotonic() - credit_started
                groups.append(group)
            build_started = time.monotonic()
            batch = build_batch(groups, self.filters)
            for (name, env), count in batch.flagged.items():
                metrics.FILTERED.labels(filter=name, env=env).inc(count)
            if batch.samples:
                encoded = encode_batch(batch.samples)
                build_seconds = credit_seconds + time.monotonic() - build_started
                metrics.BATCH_BUILD.observe(build_seconds)
                gen_seconds = build_started - started - credit_seconds
                return BuiltStep(batch, encoded, gen_seconds, build_seconds, phase.credit.state_dict())
            metrics.EMPTY_BATCHES.inc()
            rollouts = batch.rollouts
            rates = ", ".join(
                f"{k.removeprefix('filter/').removesuffix('_ratio')} flagged {v:.0%}"
                for k, v in batch.metrics.items()
                if k.startswith("filter/")
            )
            log.warning(
                "attempt %d/%d: all %d rollouts of the batch were filtered (%s); regenerating",
                attempt,
                MAX_BATCH_ATTEMPTS,
                batch.rollouts,
                rates,
            )
        raise RunFailed(
            f"every rollout of {MAX_BATCH_ATTEMPTS} consecutive batches was filtered, nothing to train "
            f"(last batch: {rollouts} rollouts; "
            f"{rates or 'no filter flagged them: no algorithm credited any token'})"
        )

    async def _train(self, built: BuiltStep, phase: Phase, scheduler: GroupScheduler) -> StepOutcome:
        step, version = self.progress.trainer_step, self.progress.version
        lag = version - built.batch.policy_start if phase.live else 0
        if phase.live:
            for group in built.batch.groups:
                metrics.OFF_POLICY.observe(version - group.policy_start)
        state = self.checkpointer.state_after(built, phase)
        started = time.monotonic()
        result = await self.trainer.submit(
            built.encoded,
            step=step,
            version=version,
            learning_rate=phase.learning_rate,
            metrics={**built.batch.metrics, "off_policy_lag": float(lag)},
            orchestrator_state=state.to_bytes(),
        )
        train_seconds = time.monotonic() - started
        if not result.skipped and result.step != step + 1:
            raise RunFailed(
                f"the trainer answered step {result.step} to batch step {step}; expected {step + 1}"
            )
        self.progress.moved_to(result.step, result.version)
        scheduler.set_version(result.version)
        return StepOutcome(built, result, train_seconds, lag, version)

    async def _after_step(self, phase: Phase, outcome: StepOutcome, scheduler: GroupScheduler) -> bool:
        """Records a finished step; runs the evals due. True ends the phase."""
        now = time.monotonic()
        step_seconds, self._last_step_end = now - self._last_step_end, now
        result = outcome.result
        if result.skipped:
            self._skips_in_a_row += 1
            metrics.SKIPPED_STEPS.inc()
            log.warning("the trainer skipped step %d: %s", self.progress.trainer_step, result.skip_reason)
            if self._skips_in_a_row >= MAX_SKIPS_IN_A_ROW:
                raise RunFailed(
                    f"the trainer skipped {self._skips_in_a_row} steps in a row: {result.skip_reason}"
                )
            return False
        self._skips_in_a_row = 0
        for failure in result.broadcast_failures:
            log.error("weights of version %d did not reach %s", result.version, failure)
        state = self.progress.state
        phase.count_step(state, outcome.built, step_seconds)
        dropped, drops = scheduler.take_drops()
        record = self.recorder.step_record(phase, phase.steps_done(state), outcome, step_seconds, dropped)
        self.recorder.publish(phase, record)
        if phase.keeps_rollouts():
            self.recorder.keep_rollouts(record)
        await self.recorder.write_traces(phase, record, drops)
        end_phase = await phase.evals_due(self.evaluator, record.number, record.line)
        self.recorder.write_line(phase, record, outcome, step_seconds)
        self._last_step_end = time.monotonic()  # evals and checkpoints do not count as step time
        return end_phase or self.stop.is_set()
