"""The progress bar of `rlrun local`: step, reward, the latest eval with its step, tokens/s,
off-policy lag, and the groups that failed or were dropped as stale; the first failed rollout
is said at once, with its env, task and error."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm import tqdm

from rlrun.common.config import RunConfig
from rlrun.common.wire.orchestrator import RunStatus

SHOWN = {"running": "rl", "succeeded": "done", "": "?"}
"""How the bar names a run phase, where not as the run does."""
FAILURE_LINE_EVERY_S = 5.0
"""Without a bar, a line when the failure counts moved, at most this often."""


def fields(status: RunStatus) -> dict[str, object]:
    """What the bar (or a progress line) shows of a status."""
    shown: dict[str, object] = {
        "phase": SHOWN.get(status.phase, status.phase),
        "reward": f"{status.train_reward:.3f}",
    }
    if status.eval_step >= 0:
        shown[status.eval_split or "eval"] = f"{status.eval_reward:.3f}@{status.eval_step}"
    shown["tok/s"] = f"{status.tokens_per_s:.0f}"
    shown["lag"] = status.off_policy_lag
    if status.groups_failed:
        shown["failed"] = status.groups_failed
    if status.groups_dropped_stale:
        shown["stale"] = status.groups_dropped_stale
    return shown


class RunProgress:
    """A tqdm bar on a terminal; without one (or with --no-progress), a line every few steps,
    after each eval and when groups fail."""

    def __init__(self, config: RunConfig, enabled: bool = True, every: int = 10, log: Path | None = None):
        self.total = config.orchestrator.max_steps
        self.bar = (
            tqdm(total=self.total, unit="step", dynamic_ncols=True, file=sys.stderr) if enabled else None
        )
        self.every = every
        self.log = log
        """Where every failure is logged (the orchestrator's log), named with the first."""
        self.last_step = -1
        self.last_phase: str | None = None
        self.last_eval: tuple[str, int] = ("", -1)
        self.failures_seen = 0
        self.failures_said_at = 0.0
        self.first_error_said = False

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def update(self, status: RunStatus) -> None:
        if status.first_rollout_error and not self.first_error_said:
            self.first_error_said = True
            where = f"; every failure is logged in {self.log}" if self.log else ""
            self.say(
                f"rlrun local: a rollout failed: {status.first_rollout_error} (a failing group is "
                f"retried, then dropped and counted as `failed`; the run stops if most of an env's "
                f"groups fail{where})"
            )
        shown = fields(status)
        phase = str(shown["phase"])
        evaluated = (status.eval_split, status.eval_step)
        if self.bar is not None:
            if status.step > self.bar.n:
                self.bar.update(status.step - self.bar.n)
            self.bar.set_postfix(shown, refresh=True)
        elif (
            phase != self.last_phase
            or evaluated != self.last_eval
            or (status.step != self.last_step and status.step % self.every == 0)
            or self._failures_moved(status.groups_failed)
        ):
            print(
                f"step {status.step}/{self.total} " + " ".join(f"{k}={v}" for k, v in shown.items()),
                file=sys.stderr,
                flush=True,
            )
        self.last_step, self.last_phase, self.last_eval = status.step, phase, evaluated

    def _failures_moved(self, count: int) -> bool:
        now = time.monotonic()
        if count == self.failures_seen or now - self.failures_said_at < FAILURE_LINE_EVERY_S:
            return False
        self.failures_seen, self.failures_said_at = count, now
        return True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
