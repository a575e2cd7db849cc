"""The names of what a run writes into its output folder, declared once: the orchestrator
writes most of it (rlrun.orchestrator.run.outputs describes each file), `rlrun local` adds its
own, and `rlrun local`'s report and `rlrun dashboard` read it all."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
ERROR = "error.txt"
EVAL_DIR = "eval"
ROLLOUTS_DIR = "rollouts"
TRACES_DIR = "traces"
EVENTS = "events.jsonl"
RESOLVED_CONFIG = "resolved_config.json"
"""The config the run resolved to (written by `rlrun local`; `--fresh` only deletes a folder
that has it)."""

TRACE_FILE = re.compile(r"(?P<phase>warmup|rl)_step_(?P<step>[0-9]+)\.jsonl")
"""`traces/<phase>_step_<N>.jsonl`: the trace file of step N of a phase."""


def trace_file_name(phase: str, step: int) -> str:
    return f"{phase}_step_{step}.jsonl"


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """One line of `events.jsonl`, `{"time": <unix s>, "event": ..., **fields}`, the run's
    history: starts, resumes, service restarts. The orchestrator and `rlrun local` both append
    to it; each line is one write() to a file opened with O_APPEND, so their lines never mix."""
    line = json.dumps({"time": time.time(), "event": event, **fields}) + "\n"
    fd = os.open(Path(run_dir) / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
