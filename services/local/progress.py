"""The progress bar of `rlrun local`: step, reward, tokens/s and off-policy lag."""

from __future__ import annotations

import sys

from tqdm import tqdm

from rlrun.common.config import RunConfig
from rlrun.common.wire.orchestrator import RunStatus

SHOWN = {"running": "rl", "succeeded": "done", "": "?"}
"""How the bar names a run phase, where not as the run does."""


class RunProgress:
    """A tqdm bar on a terminal; without one (or with --no-progress), a line every few steps."""

    def __init__(self, config: RunConfig, enabled: bool = True, every: int = 10):
        self.total = config.orchestrator.max_steps
        self.bar = (
            tqdm(total=self.total, unit="step", dynamic_ncols=True, file=sys.stderr) if enabled else None
        )
        self.every = every
        self.last_step = -1
        self.last_phase = None

    def update(self, status: RunStatus) -> None:
        phase = SHOWN.get(status.phase, status.phase)
        fields = {
            "phase": phase,
            "reward": f"{status.train_reward:.3f}",
            "eval": f"{status.eval_reward:.3f}",
            "tok/s": f"{status.tokens_per_s:.0f}",
            "lag": status.off_policy_lag,
        }
        if self.bar is not None:
            if status.step > self.bar.n:
                self.bar.update(status.step - self.bar.n)
            self.bar.set_postfix(fields, refresh=True)
        elif phase != self.last_phase or (status.step != self.last_step and status.step % self.every == 0):
            print(
                f"step {status.step}/{self.total} " + " ".join(f"{k}={v}" for k, v in fields.items()),
                file=sys.stderr,
                flush=True,
            )
        self.last_step, self.last_phase = status.step, phase

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
