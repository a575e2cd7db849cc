"""The runs a dashboard serves, read from their folders (never written).

A folder given to the dashboard is a run folder (it holds `resolved_config.json` or
`metrics.jsonl`) or a folder of run folders (`outputs/`), looked into one level deep; it is
scanned again on every listing, so runs that start later appear. Each run has an id derived from
its resolved path, stable across restarts of the dashboard. Every file a request reads is named
here from a run id and numbers, never from a path in the request: a request can only reach the
files below of the runs found.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlrun.common.run_folder import (
    ERROR,
    EVENTS,
    METRICS,
    RESOLVED_CONFIG,
    SUMMARY,
    TRACE_FILE,
    TRACES_DIR,
    trace_file_name,
)

PHASES = ("warmup", "rl")
"""The phases with trace files."""
LIVE_S = 120.0
"""A run without a summary whose files changed within this long is shown as live."""


def run_id(path: Path) -> str:
    """The id of the run in `path` (its resolved path's digest): stable, and says nothing of the path."""
    return hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:12]


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and ((path / RESOLVED_CONFIG).is_file() or (path / METRICS).is_file())


def _read_json(path: Path | None) -> Any:
    try:
        return json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):  # absent, or being replaced right now
        return None


def _read_lines(path: Path | None) -> list[dict[str, Any]]:
    """The complete JSON lines of `path` (a line still being written is left for later)."""
    try:
        text = path.read_text() if path is not None else ""
    except OSError:
        return []
    rows = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n") or not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


class Run(Protocol):
    """What the app asks of a run: a run folder, or a run seen through its status service
    (remote.RemoteRun)."""

    @property
    def id(self) -> str: ...

    def info(self) -> dict[str, Any]: ...

    def config(self) -> dict[str, Any] | None: ...

    def summary(self) -> dict[str, Any] | None: ...

    def error(self) -> str | None: ...

    def metrics(self) -> list[dict[str, Any]]: ...

    def events(self) -> list[dict[str, Any]]: ...

    def trace_steps(self) -> list[dict[str, Any]]: ...

    def trace_groups(self, phase: str, step: int) -> list[dict[str, Any]] | None: ...


@dataclass(frozen=True)
class RunFolder:
    path: Path
    """Resolved."""

    @property
    def id(self) -> str:
        return run_id(self.path)

    def file(self, *parts: str) -> Path | None:
        """A file of the run; one that resolves outside the folder (a symbolic link out of it)
        is not the run's (None), and reads as absent."""
        path = self.path.joinpath(*parts)
        return path if path.resolve().is_relative_to(self.path) else None

    def config(self) -> dict[str, Any] | None:
        return _read_json(self.file(RESOLVED_CONFIG))

    def summary(self) -> dict[str, Any] | None:
        return _read_json(self.file(SUMMARY))

    def error(self) -> str | None:
        path = self.file(ERROR)
        try:
            return path.read_text() if path is not None else None
        except OSError:
            return None

    def metrics(self) -> list[dict[str, Any]]:
        return _read_lines(self.file(METRICS))

    def events(self) -> list[dict[str, Any]]:
        return _read_lines(self.file(EVENTS))

    def updated(self) -> float:
        """When the run last wrote its metrics or events (0 when it has written neither)."""
        times = []
        for name in (METRICS, EVENTS, SUMMARY):
            path = self.file(name)
            try:
                times.append(path.stat().st_mtime if path is not None else 0.0)
            except OSError:
                continue
        return max(times, default=0.0)

    def info(self) -> dict[str, Any]:
        """What the run list shows: name, phase, steps, when it last wrote."""
        config = self.config() or {}
        summary = self.summary()
        rows = self.metrics()
        steps = [r for r in rows if r.get("phase") in PHASES]
        rl = [r for r in steps if r.get("phase") == "rl"]
        updated = self.updated()
        if summary is not None:
            phase = summary.get("phase", "finished")
        elif self.error() is not None:
            phase = "failed"
        elif steps:
            phase = "running" if steps[-1]["phase"] == "rl" else "warmup"
        else:
            phase = "pending"
        orchestrator = config.get("orchestrator") or {}
        return {
            "id": self.id,
            "name": config.get("name") or self.path.name,
            "path": str(self.path),
            "phase": phase,
            "live": summary is None and phase != "failed" and time.time() - updated < LIVE_S,
            "step": rl[-1]["step"] if rl else 0,
            "max_steps": orchestrator.get("max_steps") or (summary or {}).get("max_steps"),
            "warmup_steps": sum(1 for r in steps if r.get("phase") == "warmup"),
            "policy_version": steps[-1].get("policy_version") if steps else None,
            "train_reward": rl[-1].get("reward_mean") if rl else None,
            "eval_reward": next(
                (r.get("eval_reward") for r in reversed(rows) if r.get("phase") == "eval"), None
            ),
            "updated": updated,
        }

    def trace_steps(self) -> list[dict[str, Any]]:
        """The steps with a trace file, warm start first, each phase by step."""
        found = []
        directory = self.path / TRACES_DIR
        for path in directory.iterdir() if directory.is_dir() else []:
            match = TRACE_FILE.fullmatch(path.name)
            if match:
                found.append({"phase": match["phase"], "step": int(match["step"])})
        return sorted(found, key=lambda s: (PHASES.index(s["phase"]), s["step"]))

    def trace_groups(self, phase: str, step: int) -> list[dict[str, Any]] | None:
        """The lines of a trace file (None when the run has none for that step)."""
        if phase not in PHASES:
            return None
        path = self.file(TRACES_DIR, trace_file_name(phase, step))
        return _read_lines(path) if path is not None and path.is_file() else None


def find_runs(folders: Iterable[Path]) -> dict[str, RunFolder]:
    """id -> run of every run in `folders` (run folders, or folders of them, one level deep)."""
    runs: dict[str, RunFolder] = {}
    for folder in folders:
        folder = Path(folder).expanduser().resolve()
        candidates = (
            [folder] if is_run_folder(folder) else sorted(folder.iterdir()) if folder.is_dir() else []
        )
        for candidate in candidates:
            if is_run_folder(candidate):
                run = RunFolder(candidate.resolve())
                runs.setdefault(run.id, run)
    return runs


class RunSources:
    """The runs a dashboard serves: those in the folders it was started with, plus `extra()`
    (the registry of `rlrun local` runs), read again on every call, and `remote` ones."""

    def __init__(
        self,
        folders: list[Path],
        extra: Callable[[], list[Path]] | None = None,
        remote: Iterable[Run] = (),
    ):
        self.folders = [Path(f) for f in folders]
        self.extra = extra
        self.remote = list(remote)

    def runs(self) -> dict[str, Run]:
        found: dict[str, Run] = {r.id: r for r in self.remote}
        found.update(find_runs([*self.folders, *(self.extra() if self.extra else [])]))
        return found

    def get(self, rid: str) -> Run | None:
        return self.runs().get(rid)
