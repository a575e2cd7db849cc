"""The orchestrator's part of a checkpoint: saved through the trainer's SaveCheckpoint
(extra_state) atomically with the weights, and handed back by the trainer's GetStatus
(resume_state) when it resumes from that checkpoint."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT = "rlrun.orchestrator.state/1"


@dataclass
class OrchestratorState:
    trainer_step: int
    """Trainer steps taken when the state was saved (warm start included)."""
    policy_version: int
    warmup_steps: int = 0
    warmup_done: bool = False
    rl_steps: int = 0
    sampler: dict[str, Any] = field(default_factory=dict)
    """The task sampler's RNG state."""
    algorithms: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per algorithm id, its state (e.g. running baselines)."""
    eval_reward_start: float | None = None
    win_rate_start: float | None = None
    """The learner seat's eval win rate before RL (multi-agent runs)."""
    train_reward_start: float | None = None
    dev_reward: float | None = None
    groups_dropped_stale: int = 0
    rl_tokens: int = 0
    """Sampled tokens of the RL phase so far (for the run's tokens/s)."""
    rl_seconds: float = 0.0
    """Wall time of the RL phase so far."""

    def to_bytes(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> OrchestratorState:
        try:
            raw = json.loads(data.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"the trainer's resume_state is not orchestrator state: {error}") from None
        if not isinstance(raw, dict) or raw.pop("format", None) != FORMAT:
            raise ValueError(f"the trainer's resume_state is not orchestrator state in format {FORMAT!r}")
        try:
            return cls(**raw)
        except TypeError as error:
            raise ValueError(f"the trainer's resume_state does not match {FORMAT!r}: {error}") from None
