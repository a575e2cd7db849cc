"""What the run reports: a metrics line per step (metrics.jsonl and the [monitor] sinks),
the Prometheus gauges, the live status, the rollout dumps and trace files, the run's events
(start, resume), and the summary or error at the end."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from rlrun.common.config.orchestrator import OrchestratorConfig
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator import metrics
from rlrun.orchestrator.collect.scheduler import DroppedGroup
from rlrun.orchestrator.credit.batching import LOW_TRAIN_FRACTION
from rlrun.orchestrator.run.evaluator import EvalRecord
from rlrun.orchestrator.run.outputs import ROLLOUTS_DIR, RunOutputs, trace_row
from rlrun.orchestrator.run.phase import Phase
from rlrun.orchestrator.run.progress import Progress
from rlrun.orchestrator.run.state import OrchestratorState
from rlrun.orchestrator.run.step import StepOutcome, StepRecord
from rlrun.orchestrator.run.traces import TraceWriter

log = logging.getLogger(__name__)


class Recorder:
    def __init__(
        self,
        orch: OrchestratorConfig,
        status: RunStatus,
        outputs: RunOutputs,
        progress: Progress,
        traces: TraceWriter,
    ):
        self.orch = orch
        self.status = status
        self.outputs = outputs
        self.progress = progress
        self.traces = traces

    def step_record(
        self,
        phase: Phase,
        number: int,
        outcome: StepOutcome,
        step_seconds: float,
        dropped: dict[str, int] | None = None,
    ) -> StepRecord:
        """`dropped`: groups dropped since the step before, by reason (`stale`, or a failure's
        label), each a `groups_dropped/<reason>` key of the line."""
        result, built = outcome.result, outcome.built
        batch = built.batch
        line: dict[str, Any] = {
            "step": number,
            "trainer_step": self.progress.trainer_step,
            "phase": phase.name,
            "policy_version": result.version,
            **batch.metrics,
            "off_policy_lag": outcome.off_policy_lag,
            "groups_dropped_stale": self.progress.groups_dropped_stale(),
            **{f"groups_dropped/{reason}": count for reason, count in (dropped or {}).items()},
            "step_seconds": step_seconds,
            "gen_seconds": built.gen_seconds,
            "train_seconds": outcome.train_seconds,
            "batch_build_seconds": built.build_seconds,
            "tokens_per_s": batch.generated_tokens / step_seconds if step_seconds > 0 else 0.0,
            **{f"trainer/{k}": v for k, v in result.metrics.items()},
        }
        if batch.trained_fraction <= LOW_TRAIN_FRACTION:
            log.warning(
                "only %.0f%% of the batch's %d rollouts train (filtered %.0f%%)",
                100 * batch.trained_fraction,
                batch.rollouts,
                100 * batch.metrics["filtered_ratio"],
            )
        return StepRecord(number, batch, line)

    def publish(self, phase: Phase, record: StepRecord) -> None:
        """The status and the gauges after a trained step."""
        st, line, batch = self.status, record.line, record.batch
        m = batch.metrics
        st.version = line["policy_version"]
        st.off_policy_lag = int(line["off_policy_lag"])
        st.tokens_per_s = line["tokens_per_s"]
        st.groups_dropped_stale = line["groups_dropped_stale"]
        st.metrics = {
            k: float(v) for k, v in line.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        phase.publish(st, record)
        metrics.POLICY_VERSION.set(st.version)
        metrics.FILTERED_RATIO.set(m["filtered_ratio"])
        metrics.TOKENS_PER_SECOND.set(st.tokens_per_s)
        metrics.GENERATED_TOKENS.inc(batch.generated_tokens)
        metrics.STEP_SECONDS.observe(line["step_seconds"])
        for group in batch.groups:
            metrics.ROLLOUTS.labels(env=group.env).inc(len(group.trained_traces))
        if "advantage_mean" in m:
            metrics.ADVANTAGE_MEAN.set(m["advantage_mean"])
            metrics.ADVANTAGE_STD.set(m["advantage_std"])
            metrics.ADVANTAGE_ABS_MAX.set(max(abs(m["advantage_min"]), abs(m["advantage_max"])))

    def keep_rollouts(self, record: StepRecord) -> None:
        """An RL step's traces: the [monitor] sample table, and a dump when one is due."""
        traces = [t for g in record.batch.groups for t in g.traces]
        self.outputs.track_rollouts(record.number, traces)
        interval = self.orch.save_rollouts_interval
        if interval and record.number % interval == 0:
            batch = record.batch
            rows = [trace_row(t, batch.flags.get(t.id, []), t.id in batch.filtered) for t in traces]
            self.outputs.write_rows(ROLLOUTS_DIR, f"step_{record.number}", rows)

    async def write_traces(self, phase: Phase, record: StepRecord, drops: list[DroppedGroup]) -> None:
        await self.traces.write(phase.name, record, drops)

    def write_line(self, phase: Phase, record: StepRecord, outcome: StepOutcome, step_seconds: float) -> None:
        self.outputs.append_metrics(record.line)
        log.info(
            "%s step %d/%d (trainer step %d, version %d): reward %.3f, %d tokens, lag %d, %.2fs",
            phase.name,
            record.number,
            phase.max_steps,
            self.progress.trainer_step,
            outcome.result.version,
            record.batch.metrics.get("reward_mean", 0.0),
            record.batch.generated_tokens,
            outcome.off_policy_lag,
            step_seconds,
        )

    # -- start and end ------------------------------------------------------------------------------

    def resumed(self, state: OrchestratorState, checkpoint: str, resumes: int) -> None:
        """The run (re)starts from the checkpoint of `state`: later outputs go."""
        self.outputs.resume_after(state.trainer_step, state.warmup_steps, state.rl_steps)
        self.status.step = state.rl_steps
        self.status.version = state.policy_version
        self.status.resumes = resumes
        self.outputs.event(
            "resume" if state.trainer_step else "start",
            trainer_step=state.trainer_step,
            step=state.rl_steps,
            warmup_step=state.warmup_steps,
            checkpoint=checkpoint,
        )
        if state.trainer_step:
            log.info(
                "resumed at trainer step %d (warm-start steps %d, rl steps %d, version %d)%s",
                state.trainer_step,
                state.warmup_steps,
                state.rl_steps,
                state.policy_version,
                f" from {checkpoint}" if checkpoint else "",
            )
        else:
            log.info("starting at step 0 in %s", self.outputs.run_dir)

    def finished(self, stop_reason: str | None, last_eval: EvalRecord | None) -> None:
        if stop_reason is not None:
            self.status.last_error = f"stopped by request: {stop_reason}"
            self.status.phase = "failed"
        else:
            self.status.phase = "succeeded"
        self.outputs.write_summary(self.summary(last_eval))
        log.info("run %s after %d rl steps", self.status.phase, self.progress.state.rl_steps)

    def failed(self, reason: str, error: BaseException, expected: bool, last_eval: EvalRecord | None) -> None:
        log.error("run failed: %s", reason, exc_info=None if expected else error)
        self.status.phase = "failed"
        self.status.last_error = reason
        details = "" if expected else "\n\n" + "".join(traceback.format_exception(error))
        try:
            self.outputs.write_error(reason + details)
            self.outputs.write_summary(self.summary(last_eval))
        except OSError as write_error:
            log.error("could not write the failure to %s: %s", self.outputs.run_dir, write_error)

    def summary(self, last: EvalRecord | None) -> dict[str, Any]:
        state = self.progress.state
        multi_agent = (
            {
                "win_rate_start": state.win_rate_start,
                "win_rate_end": last.summary.get("win_rate") if last else None,
            }
            if self.orch.members
            else {}
        )
        return {
            "phase": self.status.phase,
            "steps": state.rl_steps,
            "max_steps": self.orch.max_steps,
            "warmup_steps": state.warmup_steps,
            "trainer_steps": self.progress.trainer_step,
            "policy_version": self.progress.version,
            "eval_reward_start": state.eval_reward_start,
            "eval_reward_end": last.summary["eval_reward"] if last else None,
            "pass_at_k_end": last.summary["pass_at_k"] if last else None,
            "dev_reward": state.dev_reward,
            "train_reward_start": state.train_reward_start,
            "train_reward_end": self.status.train_reward if state.rl_steps else None,
            "tokens_per_s": state.rl_tokens / state.rl_seconds if state.rl_seconds > 0 else 0.0,
            "rl_seconds": state.rl_seconds,
            "groups_dropped_stale": self.progress.groups_dropped_stale(),
            **multi_agent,
            "last_error": self.status.last_error,
        }
