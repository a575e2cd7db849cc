"""rlrun/v1/orchestrator.proto: the run's live status, shared by the orchestrator's servicer and
its clients (`rlrun local`, the operator)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rlrun.common.wire.trace import TaskRef
from rlrun.v1 import orchestrator_pb2

SERVICE_NAME = orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name

RunPhase = Literal["", "pending", "warmup", "running", "succeeded", "failed", "stopping"]
"""The run's phase ("": not reported, the proto's UNSPECIFIED)."""

_PHASE_TO_PB: dict[RunPhase, orchestrator_pb2.RunPhase] = {
    "": orchestrator_pb2.RUN_PHASE_UNSPECIFIED,
    "pending": orchestrator_pb2.RUN_PHASE_PENDING,
    "warmup": orchestrator_pb2.RUN_PHASE_WARMUP,
    "running": orchestrator_pb2.RUN_PHASE_RUNNING,
    "succeeded": orchestrator_pb2.RUN_PHASE_SUCCEEDED,
    "failed": orchestrator_pb2.RUN_PHASE_FAILED,
    "stopping": orchestrator_pb2.RUN_PHASE_STOPPING,
}
_PHASE_FROM_PB: dict[int, RunPhase] = {v: k for k, v in _PHASE_TO_PB.items()}
FINAL: frozenset[RunPhase] = frozenset({"succeeded", "failed"})


@dataclass
class RunStatus:
    phase: RunPhase = "pending"
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

    # -- the rollouts' FailureSink (orchestrator/collect/rollouts.py): counted as they happen ---

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


def status_request() -> orchestrator_pb2.GetRunStatusRequest:
    return orchestrator_pb2.GetRunStatusRequest()


def status_to_proto(status: RunStatus) -> orchestrator_pb2.GetRunStatusResponse:
    """Metrics that are not finite numbers are left out (the proto's JSON mapping has none)."""
    return orchestrator_pb2.GetRunStatusResponse(
        phase=_PHASE_TO_PB[status.phase],
        step=status.step,
        max_steps=status.max_steps,
        policy_version=status.version,
        train_reward=status.train_reward,
        eval_reward=status.eval_reward,
        off_policy_lag=status.off_policy_lag,
        tokens_per_s=status.tokens_per_s,
        last_error=status.last_error,
        groups_dropped_stale=status.groups_dropped_stale,
        resumes=status.resumes,
        eval_step=status.eval_step,
        eval_split=status.eval_split,
        groups_failed=status.groups_failed,
        first_rollout_error=status.first_rollout_error,
        metrics={k: v for k, v in status.metrics.items() if isinstance(v, int | float) and math.isfinite(v)},
    )


def status_from_proto(msg: orchestrator_pb2.GetRunStatusResponse) -> RunStatus:
    """A phase this side does not know reads as "" (not reported)."""
    return RunStatus(
        phase=_PHASE_FROM_PB.get(msg.phase, ""),
        step=msg.step,
        max_steps=msg.max_steps,
        version=msg.policy_version,
        train_reward=msg.train_reward,
        eval_reward=msg.eval_reward,
        off_policy_lag=msg.off_policy_lag,
        tokens_per_s=msg.tokens_per_s,
        last_error=msg.last_error,
        groups_dropped_stale=msg.groups_dropped_stale,
        resumes=msg.resumes,
        eval_step=msg.eval_step,
        eval_split=msg.eval_split,
        groups_failed=msg.groups_failed,
        first_rollout_error=msg.first_rollout_error,
        metrics=dict(msg.metrics),
    )


def stop_request_to_proto(reason: str) -> orchestrator_pb2.StopRequest:
    return orchestrator_pb2.StopRequest(reason=reason)


def stop_request_from_proto(msg: orchestrator_pb2.StopRequest) -> str:
    """The reason ("" when none was given)."""
    return msg.reason


def stop_response_to_proto(phase: RunPhase) -> orchestrator_pb2.StopResponse:
    return orchestrator_pb2.StopResponse(phase=_PHASE_TO_PB[phase])


def stop_response_from_proto(msg: orchestrator_pb2.StopResponse) -> RunPhase:
    return _PHASE_FROM_PB.get(msg.phase, "")
