"""Per-env logs: `<log_dir>/envs/<split>/<env name>.log`, one JSON object per line.

The main process writes one line per rollout it returns; worker processes add their own
records (tracebacks of failing harnesses) when logged with `extra={"split": ...}`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from rlrun.common.logs import JsonFormatter
from rlrun.common.wire.env import TraceSummary, stop_condition_name

SERVICE = "env-server"


def env_log_path(log_dir: Path, split: str, name: str) -> Path:
    return Path(log_dir) / "envs" / split / f"{name}.log"


def _file_handler(path: Path) -> logging.FileHandler:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(JsonFormatter(SERVICE))
    return handler


class RolloutLog:
    """One JSON line per request (a group, or a single rollout), in the log of its split."""

    def __init__(self, log_dir: Path, name: str):
        self.log_dir = Path(log_dir)
        self.name = name
        self._loggers: dict[str, logging.Logger] = {}

    def _logger(self, split: str) -> logging.Logger:
        logger = self._loggers.get(split)
        if logger is None:
            logger = logging.getLogger(f"rlrun.env_server.rollouts.{self.name}.{split}")
            logger.propagate = False
            logger.setLevel(logging.INFO)
            for old in list(logger.handlers):
                logger.removeHandler(old)
                old.close()
            logger.addHandler(_file_handler(env_log_path(self.log_dir, split, self.name)))
            self._loggers[split] = logger
        return logger

    def record(self, split: str, idx: int, group_id: str, traces: Sequence[TraceSummary]) -> None:
        """Logs the outcome of one request: its task, and per trace (one per rollout, or per
        member of a multi-agent rollout) its rollout id, member, reward and stop condition,
        plus every error."""
        self._logger(split).info(
            "rollouts",
            extra={
                "env": self.name,
                "split": split,
                "idx": idx,
                "group_id": group_id,
                "rollout_ids": [t.rollout_id for t in traces],
                "member_ids": [t.member_id for t in traces],
                "rewards": [t.reward for t in traces],
                "stop_conditions": [stop_condition_name(t.stop_condition) for t in traces],
                "errors": [
                    {
                        "rollout_id": t.rollout_id,
                        "type": e.type,
                        "message": e.message,
                        "retryable": e.retryable,
                    }
                    for t in traces
                    for e in t.errors
                ],
                "total_s": max((t.total_s for t in traces), default=0.0),
            },
        )

    def close(self) -> None:
        for logger in self._loggers.values():
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
                handler.close()
        self._loggers.clear()


class SplitFileHandler(logging.Handler):
    """Writes records that carry a `split` attribute to that split's env log; ignores the rest."""

    def __init__(self, log_dir: Path, name: str):
        super().__init__()
        self.log_dir = Path(log_dir)
        self.name = name
        self._files: dict[str, logging.FileHandler] = {}

    def emit(self, record: logging.LogRecord) -> None:
        split = getattr(record, "split", None)
        if split is None:
            return
        handler = self._files.get(split)
        if handler is None:
            handler = self._files[split] = _file_handler(env_log_path(self.log_dir, split, self.name))
        handler.emit(record)

    def close(self) -> None:
        for handler in self._files.values():
            handler.close()
        self._files.clear()
        super().close()
