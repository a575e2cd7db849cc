"""What the orchestrator writes into the run folder (`rlrun local` and people read it):

- `metrics.jsonl`: one JSON object per step (phase `warmup` or `rl`) and per eval (phase
  `eval`, or `dev` for the warm start's dev check); every line has `step` (the step count of
  its phase), `trainer_step`, `phase` and `time` (unix seconds). A step's line counts the
  groups dropped since the step before as `groups_dropped/<reason>` (`stale`, or a failure's
  label: `internal`, `trace_errors`, ...), and `groups_dropped_stale` all the stale ones so far.
- `eval/step_<N>.jsonl` (eval after N RL steps) and `eval/dev_step_<N>.jsonl` (warm-start dev
  check after N warm steps): one line per rollout.
- `rollouts/step_<N>.jsonl` when `orchestrator.save_rollouts_interval` is set: every trace, in
  the proto's JSON mapping except the task's `exampleId`, which is the id itself (an int stays
  an int, a str a str), plus `isFiltered` (an enforced filter kept it from training) and
  `filters` (the names of the filters that flagged it, enforced or monitored; [] when none).
- `traces/<phase>_step_<N>.jsonl` (`orchestrator.traces`): a sample of the groups of step N
  of the phase (`warmup` or `rl`) and of the groups dropped since the step before, for the
  dashboard's trace viewer; traces.py describes a line.
- `events.jsonl`: the run's history, one `{"time", "event", ...}` line per start or resume
  (here) and per service restart (`rlrun local`); never pruned.
- `summary.json` at the end, `error.txt` when the run failed.

The names are rlrun.common.run_folder's (`rlrun local` and `rlrun dashboard` read them).

Nothing here is deleted to start over (`rlrun local --fresh` clears the folder itself): a run
resumed at a checkpoint keeps what belongs to the steps up to it and drops the rest, so the
step sequence has no gap and no duplicate (a step trained again gets a new line).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rlrun.common.run_folder import (
    ERROR,
    EVAL_DIR,
    METRICS,
    ROLLOUTS_DIR,
    SUMMARY,
    TRACES_DIR,
    append_event,
    trace_file_name,
)
from rlrun.common.wire.trace import Trace, trace_to_json
from rlrun.orchestrator.run import tracking

__all__ = ["EVAL_DIR", "METRICS", "ROLLOUTS_DIR", "STEP_PHASES", "RunOutputs", "trace_row"]

STEP_PHASES = ("warmup", "rl")
"""The phases whose lines record a trained step (the others record evals)."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def trace_row(
    trace: Trace, filters: list[str] | None = None, is_filtered: bool | None = None
) -> dict[str, Any]:
    """A trace as a JSON row; a kept rollout (`filters` given) also records `isFiltered` and
    the filters that flagged it."""
    row = trace_to_json(trace)
    if trace.task.example_id is not None:
        row["task"]["exampleId"] = trace.task.example_id
    if filters is not None:
        row["isFiltered"] = bool(is_filtered)
        row["filters"] = list(filters)
    return row


class RunOutputs:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS

    def recorded_trainer_step(self) -> int | None:
        """The trainer step of the last training step recorded in metrics.jsonl (0 when it
        has none yet); None when there is no metrics.jsonl (a new run folder, or an
        orchestrator whose folder did not survive: the trainer's checkpoints decide)."""
        if not self.metrics_path.exists():
            return None
        steps = [
            row.get("trainer_step", 0)
            for line in self.metrics_path.read_text().splitlines()
            if line.strip() and (row := json.loads(line)).get("phase") in STEP_PHASES
        ]
        return max(steps, default=0)

    def resume_after(self, trainer_step: int, warmup_steps: int, rl_steps: int) -> None:
        """Keeps only what the first `trainer_step` steps wrote (the checkpoint's)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (SUMMARY, ERROR):
            (self.run_dir / name).unlink(missing_ok=True)
        if self.metrics_path.exists():
            kept = [
                line
                for line in self.metrics_path.read_text().splitlines()
                if line.strip() and json.loads(line).get("trainer_step", 0) <= trainer_step
            ]
            self.metrics_path.write_text("".join(line + "\n" for line in kept))
        limits = {
            "step": rl_steps,
            "dev_step": warmup_steps,
            "rl_step": rl_steps,
            "warmup_step": warmup_steps,
        }
        for directory in (self.run_dir / EVAL_DIR, self.run_dir / ROLLOUTS_DIR, self.run_dir / TRACES_DIR):
            for path in directory.glob("*.jsonl") if directory.exists() else []:
                kind, _, number = path.stem.rpartition("_")
                if number.isdigit() and int(number) > limits.get(kind, rl_steps):
                    path.unlink()

    def append_metrics(self, line: dict[str, Any]) -> None:
        """Appends `line`, stamped with the wall time it was written at (`time`, unix seconds)."""
        line = {**line, "time": time.time()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(_jsonable(line)) + "\n")
        tracking.log_metrics(line)

    def track_rollouts(self, step: int, traces: list[Trace]) -> None:
        """An RL step's traces, for the sample table of `[monitor]` (when that step is due)."""
        tracking.log_rollouts(step, traces)

    def write_rows(self, folder: str, name: str, rows: list[dict[str, Any]]) -> Path:
        directory = self.run_dir / folder
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps(_jsonable(row)) + "\n" for row in rows))
        return path

    def write_traces(self, phase: str, step: int, rows: list[dict[str, Any]]) -> Path:
        """The trace file of step `step` of `phase`, replaced whole (a step trained again after
        a resume writes it anew)."""
        name = trace_file_name(phase, step)
        directory = self.run_dir / TRACES_DIR
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(_jsonable(row)) + "\n" for row in rows))
        return tmp.replace(directory / name)

    def event(self, event: str, **fields: Any) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        append_event(self.run_dir, event, **fields)

    def write_summary(self, summary: dict[str, Any]) -> None:
        path = self.run_dir / SUMMARY
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_jsonable(summary), indent=2))
        tmp.replace(path)

    def write_error(self, message: str) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / ERROR).write_text(message.rstrip() + "\n")
