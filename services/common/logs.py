"""Structured logging for every rlrun process.

`setup_logging(service, log_file)` configures the root logger with two handlers:

- stderr: one human-readable line per record,
  `2025-01-01T12:00:00.123Z INFO  [inference] rlrun.inference.server: loaded model step=3`
- `log_file` (optional): one JSON object per line with `ts`, `level`, `service`, `logger`,
  `msg`, every field passed through `extra={...}`, and `exc` when there is a traceback.

Calling it again replaces the handlers it installed before (it never stacks duplicates) and
leaves handlers installed by others (pytest's caplog, for instance) alone.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["JsonFormatter", "HumanFormatter", "setup_logging", "extra_fields"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
_MARK = "_rlrun_handler"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a caller attached to `record` through `extra=`."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, service, logger, msg, extras, exc."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            payload.setdefault(key, value)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            payload["exc"] = record.exc_text
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        return json.dumps(payload, default=str, ensure_ascii=False)


class HumanFormatter(logging.Formatter):
    """`TS LEVEL [service] logger: msg key=value ...` (plus the traceback, if any)."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<5} [{self.service}] {record.name}: {record.getMessage()}"
        extras = extra_fields(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def _level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    value = logging.getLevelName(level.strip().upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r}")
    return value


def setup_logging(service: str, log_file: Path | None = None, level: str | int = "INFO") -> logging.Logger:
    """Configures the root logger for `service` (see module doc); returns the logger
    `rlrun.<service>`. Idempotent; creates the parent folders of `log_file`."""
    root = logging.getLogger()
    numeric = _level(level)
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
            handler.close()

    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(HumanFormatter(service))
    setattr(stderr, _MARK, True)
    root.addHandler(stderr)

    if log_file is not None:
        path = Path(log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(path, encoding="utf-8")
        file_handler.setFormatter(JsonFormatter(service))
        setattr(file_handler, _MARK, True)
        root.addHandler(file_handler)

    root.setLevel(numeric)
    logging.captureWarnings(True)
    return logging.getLogger(f"rlrun.{service}")
