"""The run's live status and the OrchestratorService that serves it (the operator and
`rlrun local` poll GetStatus; Stop ends the run, or the process once the run has finished)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rlrun.common.errors import grpc_errors
from rlrun.common.types import TaskRef
from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc

SERVICE_NAME = orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name

PHASES = {
    "pending": orchestrator_pb2.RUN_PHASE_PENDING,
    "warmup": orchestrator_pb2.RUN_PHASE_WARMUP,
    "running": orchestrator_pb2.RUN_PHASE_RUNNING,
    "succeeded": orchestrator_pb2.RUN_PHASE_SUCCEEDED,
    "failed": orchestrator_pb2.RUN_PHASE_FAILED,
    "stopping": orchestrator_pb2.RUN_PHASE_STOPPING,
}
FINAL = frozenset({"succeeded", "failed"})


@dataclass
class RunStatus:
    phase: str = "pending"
    step: int = 0
    """RL steps completed."""
    max_steps: int = 0
    version: int = 0
    train_reward: float = 0.0
    """Mean reward of the last RL batch (a warm start's oracle rollouts do not count)."""
    eval_reward: float = 0.0
    eval_step: int = -1
    """The step the eval_reward was measured after (-1: none yet)."""
    eval_split: str = ""
    """`eval` or `dev` (the warm start's dev check)."""
    off_policy_lag: int = 0
    tokens_per_s: float = 0.0
    last_error: str = ""
    groups_dropped_stale: int = 0
    resumes: int = 0
    """Times the run went back to the trainer's checkpoint after losing the trainer."""
    groups_failed: int = 0
    first_rollout_error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)

    # -- the rollouts' FailureSink (rollouts.py): counted as they happen, for the console ------

    def rollout_failed(self, env: str, task: TaskRef, reason: str) -> None:
        if not self.first_rollout_error:
            self.first_rollout_error = f"env {env!r}, {task.split} task {task.idx}: {reason}"

    def group_failed(self, env: str) -> None:
        self.groups_failed += 1

    def group_stale(self, env: str) -> None:
        self.groups_dropped_stale += 1

    def evaluated(self, split: str, step: int, reward: float) -> None:
        self.eval_split, self.eval_step, self.eval_reward = split, step, reward

    @property
    def finished(self) -> bool:
        return self.phase in FINAL

    def to_proto(self) -> orchestrator_pb2.GetRunStatusResponse:
        return orchestrator_pb2.GetRunStatusResponse(
            phase=PHASES[self.phase],
            step=self.step,
            max_steps=self.max_steps,
            policy_version=self.version,
            train_reward=self.train_reward,
            eval_reward=self.eval_reward,
            off_policy_lag=self.off_policy_lag,
            tokens_per_s=self.tokens_per_s,
            last_error=self.last_error,
            groups_dropped_stale=self.groups_dropped_stale,
            resumes=self.resumes,
            eval_step=self.eval_step,
            eval_split=self.eval_split,
            groups_failed=self.groups_failed,
            first_rollout_error=self.first_rollout_error,
            metrics={
                k: v for k, v in self.metrics.items() if isinstance(v, int | float) and math.isfinite(v)
            },
        )


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    def __init__(self, status: RunStatus, stop: Callable[[str], None]):
        self.status = status
        self.stop = stop

    @grpc_errors
    async def GetStatus(self, request, context):
        return self.status.to_proto()

    @grpc_errors
    async def Stop(self, request, context):
        self.stop(request.reason or "requested through Stop")
        return orchestrator_pb2.StopResponse(phase=PHASES[self.status.phase])
