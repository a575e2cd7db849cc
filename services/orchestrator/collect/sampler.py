"""The task sampler: which env (by ratio) and which train-split task each group runs.

Seeded, with its RNG state saved in checkpoints so that a resumed run continues the same
stream. Indices below `first_index` (the warm start's dev set) are never sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EnvTasks:
    env: str
    ratio: float
    count: int
    """Train-split task count (from the env-server's GetInfo)."""
    first_index: int = 0
    """Indices below this are held out (the dev set)."""

    def __post_init__(self) -> None:
        if self.count <= self.first_index:
            raise ValueError(
                f"env {self.env!r} has {self.count} train tasks, none left after holding out the first "
                f"{self.first_index} as the dev set (orchestrator.warm_start.dev_tasks)"
            )


class TaskSampler:
    def __init__(self, envs: list[EnvTasks], seed: int):
        if not envs:
            raise ValueError("the task sampler needs at least one env")
        self.envs = envs
        weights = np.array([e.ratio for e in envs], dtype=np.float64)
        self._probs = weights / weights.sum()
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def sample(self) -> tuple[str, int]:
        """(env key, train task index)."""
        env = (
            self.envs[int(self._rng.choice(len(self.envs), p=self._probs))]
            if len(self.envs) > 1
            else self.envs[0]
        )
        return env.env, int(self._rng.integers(env.first_index, env.count))

    def state(self) -> dict:
        return dict(self._rng.bit_generator.state)

    def load_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state
