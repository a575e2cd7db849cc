"""The two training phases. A phase knows its own step count, what a trained step adds to the
run's state, what it publishes, which evals fall due after a step and what it writes; the step
loop (loop.py) is the same for both."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from rlrun.common.config.orchestrator import OrchestratorConfig
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator import metrics
from rlrun.orchestrator.collect.rollouts import EnvRollouts
from rlrun.orchestrator.collect.scheduler import SchedulerSettings
from rlrun.orchestrator.credit.pipeline import CreditPipelines
from rlrun.orchestrator.run.state import OrchestratorState
from rlrun.orchestrator.run.step import BuiltStep, StepRecord

if TYPE_CHECKING:
    from rlrun.orchestrator.run.evaluator import Evaluator


class Phase(ABC):
    name: ClassVar[str]
    """The phase of its metrics lines."""
    status_phase: ClassVar[str]
    """The run phase its status reports."""

    def __init__(
        self,
        targets: dict[str, EnvRollouts],
        credit: CreditPipelines,
        settings: SchedulerSettings,
        max_steps: int,
    ):
        self.targets = targets
        self.credit = credit
        self.settings = settings
        self.max_steps = max_steps

    @property
    def learning_rate(self) -> float | None:
        """The learning rate its batches train at (None: the trainer's)."""
        return None

    @property
    def live(self) -> bool:
        """Its rollouts come from the live policy, so staleness and off-policy lag count."""
        return self.settings.enforce_staleness

    @abstractmethod
    def steps_done(self, state: OrchestratorState) -> int:
        """Steps of this phase that trained."""

    @abstractmethod
    def count_step(self, state: OrchestratorState, built: BuiltStep, step_seconds: float) -> None:
        """Adds a trained step to `state` (the step's wall time is 0 when not yet known)."""

    @abstractmethod
    def publish(self, status: RunStatus, record: StepRecord) -> None:
        """Its part of the status and the gauges after a step."""

    @abstractmethod
    async def evals_due(self, evaluator: Evaluator, number: int, line: dict[str, float]) -> bool:
        """Runs the evals due after step `number` (their results go into `line`); True ends
        the phase."""

    def keeps_rollouts(self) -> bool:
        """Its rollouts go to the rollout dumps and the [monitor] sample table."""
        return False

    def more_to_take(self, state: OrchestratorState, pending: bool) -> bool:
        """Room for another batch, one being in training when `pending`."""
        return self.steps_done(state) + pending < self.max_steps


class WarmupPhase(Phase):
    """The supervised warm start: an actor's (often an oracle's) rollouts, fit before RL."""

    name = "warmup"
    status_phase = "warmup"

    def __init__(
        self,
        targets: dict[str, EnvRollouts],
        credit: CreditPipelines,
        settings: SchedulerSettings,
        max_steps: int,
        learning_rate: float | None,
    ):
        super().__init__(targets, credit, settings, max_steps)
        self._learning_rate = learning_rate

    @property
    def learning_rate(self) -> float | None:
        return self._learning_rate

    def steps_done(self, state: OrchestratorState) -> int:
        return state.warmup_steps

    def count_step(self, state: OrchestratorState, built: BuiltStep, step_seconds: float) -> None:
        state.warmup_steps += 1

    def publish(self, status: RunStatus, record: StepRecord) -> None:
        metrics.WARMUP_STEPS.set(record.number)

    async def evals_due(self, evaluator: Evaluator, number: int, line: dict[str, float]) -> bool:
        return await evaluator.after_warmup_step(number, self.max_steps, line)


class RLPhase(Phase):
    name = "rl"
    status_phase = "running"

    def steps_done(self, state: OrchestratorState) -> int:
        return state.rl_steps

    def count_step(self, state: OrchestratorState, built: BuiltStep, step_seconds: float) -> None:
        state.rl_steps += 1
        state.algorithms = built.credit_state
        state.rl_tokens += built.batch.generated_tokens
        state.rl_seconds += step_seconds
        if state.train_reward_start is None:
            state.train_reward_start = built.batch.metrics.get("reward_mean")

    def publish(self, status: RunStatus, record: StepRecord) -> None:
        status.step = record.number
        # Only RL batches: a warm start's rollouts are the oracle's, whose reward says nothing
        # about the policy.
        status.train_reward = record.batch.metrics.get("reward_mean", 0.0)
        metrics.RL_STEPS.set(record.number)
        metrics.TRAIN_REWARD.set(status.train_reward)

    async def evals_due(self, evaluator: Evaluator, number: int, line: dict[str, float]) -> bool:
        await evaluator.after_rl_step(number, self.max_steps, line)
        return False

    def keeps_rollouts(self) -> bool:
        return True


def warmup_phase(
    orch: OrchestratorConfig,
    targets: dict[str, EnvRollouts],
    credit: CreditPipelines,
    live: bool,
    id_prefix: str,
) -> WarmupPhase:
    warm = orch.warm_start
    return WarmupPhase(
        targets,
        credit,
        SchedulerSettings(
            batch_size=warm.batch_size,
            group_size=1,
            max_off_policy_steps=orch.max_off_policy_steps if live else 1,  # a fixed actor never goes stale
            enforce_staleness=live,
            inflight_limit=2 * warm.batch_size,
            max_retries=orch.max_retries,
            timeout_s=orch.rollout_timeout_s,
            group_failures=orch.group_failures,
            id_prefix=id_prefix,
        ),
        max_steps=warm.max_steps,
        learning_rate=warm.lr,
    )


def rl_phase(
    orch: OrchestratorConfig,
    targets: dict[str, EnvRollouts],
    credit: CreditPipelines,
    live: bool,
    id_prefix: str,
) -> RLPhase:
    return RLPhase(
        targets,
        credit,
        SchedulerSettings(
            batch_size=orch.batch_size,
            group_size=orch.group_size,
            max_off_policy_steps=orch.max_off_policy_steps,
            enforce_staleness=live,
            inflight_limit=orch.inflight_groups,
            max_retries=orch.max_retries,
            timeout_s=orch.rollout_timeout_s,
            group_failures=orch.group_failures,
            id_prefix=id_prefix,
        ),
        max_steps=orch.max_steps,
    )
