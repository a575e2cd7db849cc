"""Evals during a run: the eval split before RL, every `orchestrator.eval.interval` RL steps
(each [[orchestrator.eval.env]] entry at its own interval, when the run has eval envs) and at
the end; the warm start's dev check every `warm_start.eval_interval` warm steps."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from rlrun.common.config.orchestrator import OrchestratorConfig
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator import metrics
from rlrun.orchestrator.collect.evaluation import eval_tasks, run_eval
from rlrun.orchestrator.collect.rollouts import EnvRollouts
from rlrun.orchestrator.run.context import RunContext
from rlrun.orchestrator.run.outputs import EVAL_DIR, RunOutputs
from rlrun.orchestrator.run.progress import Progress

log = logging.getLogger(__name__)


@dataclass
class EvalRecord:
    rl_step: int
    summary: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _EvalSpec:
    targets: dict[str, EnvRollouts]
    split: str
    num_tasks: dict[str, int]
    """Env key -> tasks per eval."""
    k: int
    name: str
    """`eval` or `dev`: the phase of its metrics line and the prefix of its summary keys."""


class Evaluator:
    def __init__(
        self,
        orch: OrchestratorConfig,
        context: RunContext,
        progress: Progress,
        outputs: RunOutputs,
        status: RunStatus,
        nonce: str,
    ):
        self.orch = orch
        self.context = context
        self.progress = progress
        self.outputs = outputs
        self.status = status
        self.nonce = nonce
        self.last: EvalRecord | None = None
        """The last eval of the eval split (not of the dev set) since the run (re)started."""

    def restarted(self) -> None:
        """The run went back to a checkpoint: evals done since are forgotten."""
        self.last = None

    # -- when they fall due -------------------------------------------------------------------

    async def before_rl(self) -> None:
        """The eval of the policy before RL, once per run."""
        state = self.progress.state
        if self.orch.eval.enabled and state.rl_steps == 0 and state.eval_reward_start is None:
            summary = await self.evaluate(rl_step=0)
            state.eval_reward_start = summary["eval_reward"]
            state.win_rate_start = summary.get("win_rate")

    def due(self, number: int, max_steps: int) -> list[str]:
        """The eval envs due after RL step `number`: those whose interval divides it, every one
        after the last step."""
        return [
            key
            for key, schedule in self.context.eval_schedule.items()
            if number == max_steps or (schedule.interval and number % schedule.interval == 0)
        ]

    async def after_rl_step(self, number: int, max_steps: int, line: dict[str, float]) -> None:
        due = self.due(number, max_steps)
        if self.orch.eval.enabled and due:
            summary = await self.evaluate(rl_step=number, envs=due)
            line["eval_reward"] = summary["eval_reward"]
            if "win_rate" in summary:
                line["win_rate"] = summary["win_rate"]

    async def after_rl(self) -> None:
        """The final eval, unless the last step already had one."""
        rl_steps = self.progress.state.rl_steps
        if self.orch.eval.enabled and (self.last is None or self.last.rl_step != rl_steps):
            await self.evaluate(rl_step=rl_steps)

    async def after_warmup_step(self, number: int, max_steps: int, line: dict[str, float]) -> bool:
        """The dev check when due; True when it reached `warm_start.target_reward`."""
        warm = self.orch.warm_start
        if number % warm.eval_interval and number < max_steps:
            return False
        dev = await self.evaluate_dev(number)
        line["dev_reward"] = dev
        if warm.target_reward is not None and dev >= warm.target_reward:
            log.info(
                "warm start reached dev reward %.3f >= %.3f after %d steps", dev, warm.target_reward, number
            )
            return True
        return False

    # -- the evals -------------------------------------------------------------------------------

    async def evaluate(self, rl_step: int, envs: list[str] | None = None) -> dict[str, float]:
        """An eval of `envs` (default: every eval env) on their eval split."""
        ev = self.orch.eval
        targets = self.context.eval_targets
        if envs is not None:
            targets = {key: target for key, target in targets.items() if key in envs}
        schedule = self.context.eval_schedule
        num_tasks = {key: schedule[key].num_tasks if key in schedule else ev.num_tasks for key in targets}
        spec = _EvalSpec(targets, "eval", num_tasks, 1 if ev.greedy else ev.pass_k, "eval")
        summary = await self._run(spec, f"step_{rl_step}", rl_step)
        self.last = EvalRecord(rl_step, summary)
        self.status.evaluated("eval", rl_step, summary["eval_reward"])
        return summary

    async def evaluate_dev(self, warm_step: int) -> float:
        targets = self.context.dev_targets
        spec = _EvalSpec(targets, "train", dict.fromkeys(targets, self.orch.warm_start.dev_tasks), 1, "dev")
        summary = await self._run(spec, f"dev_step_{warm_step}", warm_step)
        self.progress.state.dev_reward = summary["dev_reward"]
        self.status.evaluated("dev", warm_step, summary["dev_reward"])
        return summary["dev_reward"]

    async def _run(self, spec: _EvalSpec, file: str, step: int) -> dict[str, float]:
        started = time.monotonic()
        trainer_step = self.progress.trainer_step
        counts = self.context.task_counts(spec.split, spec.targets)
        tasks = [
            task
            for key, count in counts.items()
            for task in eval_tasks({key: count}, spec.split, spec.num_tasks[key])
        ]
        result = await run_eval(
            spec.targets,
            tasks,
            k=spec.k,
            solved_threshold=self.orch.eval.solved_threshold,
            concurrency=self.orch.inflight_groups,
            max_retries=self.orch.max_retries,
            timeout_s=self.orch.rollout_timeout_s,
            id_prefix=f"{spec.name}-{self.nonce}-t{trainer_step}",
            version=self.progress.version,
            name=spec.name,
        )
        self.outputs.write_rows(
            EVAL_DIR, file, [{"step": step, "trainer_step": trainer_step, **row} for row in result.rows]
        )
        summary = result.summary
        if summary["failed_groups"]:
            log.warning(
                "%s after step %d: %d of %d groups failed and are left out of the reward",
                spec.name,
                step,
                int(summary["failed_groups"]),
                len(tasks),
            )
        metrics.EVAL_REWARD.set(summary[f"{spec.name}_reward"])
        self.outputs.append_metrics(
            {
                "step": step,
                "trainer_step": trainer_step,
                "phase": spec.name,
                "split": spec.split,
                **summary,
                "eval_seconds": time.monotonic() - started,
            }
        )
        log.info(
            "%s after step %d: reward %.3f, pass@%d %.3f over %d tasks",
            spec.name,
            step,
            summary[f"{spec.name}_reward"],
            spec.k,
            summary["pass_at_k"],
            int(summary["tasks"]),
        )
        return summary
