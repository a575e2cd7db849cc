"""Experiment tracking (`[monitor]`): every metrics.jsonl line, and every
`monitor.samples_interval` RL steps a table of sample rollouts (prompt, completion, reward), go
to Weights & Biases and/or TensorBoard.

The orchestrator starts the sinks once (`start`); `RunOutputs.append_metrics` hands each
metrics line to `log_metrics` and the RL step's traces to `log_rollouts`. Numbers are logged as
`<phase>/<key>` (`rl/reward_mean`, `warmup/loss`, `eval/eval_reward`) at the line's
`trainer_step`, so every phase shares one x-axis. W&B runs offline with `monitor.wandb.mode =
"offline"` or `WANDB_MODE=offline` (the run folder is then `<dir>/wandb/offline-run-*`, for
`wandb sync`). TensorBoard event files are written with tensorboard's own writer, so the
orchestrator needs no torch for them.

A sink that fails while the run goes on logs the error once and is dropped: tracking never
stops training.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlrun.common.config import RunConfig
    from rlrun.common.wire.trace import Trace

__all__ = ["Tracker", "close", "log_metrics", "log_rollouts", "sample_rows", "start"]

log = logging.getLogger("rlrun.orchestrator.tracking")

TABLE = "samples/rollouts"
"""The key of the sample-rollouts table (W&B) and of its text summary (TensorBoard)."""
COLUMNS = ("step", "env", "prompt", "completion", "reward")


def numeric_items(line: dict[str, Any]) -> dict[str, float]:
    """The line's finite numbers as `<phase>/<key>` (booleans, the step counters and the wall
    time aside)."""
    phase = str(line.get("phase", "run"))
    out = {}
    for key, value in line.items():
        if key in ("step", "trainer_step", "phase", "time") or isinstance(value, bool):
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            out[f"{phase}/{key}"] = float(value)
    return out


def sample_rows(step: int, traces: list[Trace], limit: int) -> list[list[Any]]:
    """[step, env, prompt, completion, reward] of the first `limit` traces: the prompt is every
    message before the first assistant message, the completion every assistant message."""
    rows = []
    for trace in traces[:limit]:
        prompt, completion, answered = [], [], False
        for node in trace.nodes:
            if node.role == "assistant":
                answered = True
                completion.append(node.content)
            elif not answered:
                prompt.append(node.content)
        rows.append([step, trace.task.env, "\n".join(prompt), "".join(completion), float(trace.reward)])
    return rows


class _TensorBoard:
    def __init__(self, log_dir: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(log_dir))
        self.log_dir = log_dir

    def _event(self, step: int, values: list) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))

    def log(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event(step, [Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])

    def table(self, step: int, rows: list[list[Any]]) -> None:
        """A markdown table in TensorBoard's text plugin (what its TEXT tab renders)."""
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.compat.proto.types_pb2 import DT_STRING

        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|").replace("\n", "<br>")

        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        tensor = TensorProto(
            dtype=DT_STRING,
            string_val=["\n".join(lines).encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        self._event(step, [Summary.Value(tag=TABLE, metadata=metadata, tensor=tensor)])

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, config: RunConfig):
        import wandb

        cfg = config.monitor.wandb
        directory = Path(cfg.dir) if cfg.dir is not None else config.run_dir
        directory.mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=config.name,
            mode=cfg.mode or os.environ.get("WANDB_MODE") or "online",
            dir=str(directory),
            tags=list(cfg.tags),
            config=config.model_dump(mode="json"),
            reinit="finish_previous",
        )
        self.dir = Path(self.run.dir).parent  # .../wandb/<offline->run-<time>-<id>

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def table(self, step: int, rows: list[list[Any]]) -> None:
        self.run.log({TABLE: self.wandb.Table(columns=list(COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    """The enabled sinks of one run. `log_rollouts` keeps the due step's sample rows until the
    step's metrics line comes, which carries the trainer step they are logged at."""

    def __init__(self, config: RunConfig):
        self.monitor = config.monitor
        self.sinks: dict[str, Any] = {}
        if self.monitor.tensorboard.enabled:
            tb = self.monitor.tensorboard.log_dir
            self.sinks["tensorboard"] = _TensorBoard(Path(tb) if tb else config.run_dir / "tensorboard")
        if self.monitor.wandb.enabled:
            self.sinks["wandb"] = _Wandb(config)
        self._pending: list[list[Any]] = []

    def _each(self, what: str, *args) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                getattr(sink, what)(*args)
            except Exception:  # noqa: BLE001 - tracking must never stop the run
                log.exception("%s logging failed; it is off for the rest of the run", name)
                self.sinks.pop(name)

    def log_rollouts(self, step: int, traces: list[Trace]) -> None:
        interval = self.monitor.samples_interval
        if interval and step % interval == 0:
            self._pending = sample_rows(step, traces, self.monitor.num_samples)

    def log_metrics(self, line: dict[str, Any]) -> None:
        step = int(line.get("trainer_step", 0))
        values = numeric_items(line)
        if values:
            self._each("log", step, values)
        if self._pending and line.get("phase") == "rl":
            rows, self._pending = self._pending, []
            self._each("table", step, rows)

    def close(self) -> None:
        self._each("close")
        self.sinks.clear()


_active: Tracker | None = None


def start(config: RunConfig) -> Tracker | None:
    """Starts the run's sinks (none unless `[monitor]` enables one)."""
    global _active
    close()
    if config.monitor.enabled:
        _active = Tracker(config)
        log.info("experiment tracking: %s", ", ".join(_active.sinks))
    return _active


def log_metrics(line: dict[str, Any]) -> None:
    if _active is not None:
        _active.log_metrics(line)


def log_rollouts(step: int, traces: list[Trace]) -> None:
    if _active is not None:
        _active.log_rollouts(step, traces)


def close() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active = None
