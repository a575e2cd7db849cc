"""Real `rlrun local` runs for the benchmarks that measure the whole stack."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEMO_CONFIG = Path("configs/reverse_text.toml")
"""The demo config every benchmark is shaped by, relative to the current directory: benchmarks
run from a checkout (`make bench`), like `rlrun local configs/reverse_text.toml`."""


@dataclass
class LocalRun:
    summary: dict
    rl_rows: list[dict]

    def median(self, key: str) -> float:
        values = [row[key] for row in self.rl_rows if row.get(key) is not None]
        if not values:
            raise KeyError(f"no RL step of the run reported {key!r}")
        return statistics.median(values)

    @property
    def rl_seconds(self) -> float:
        return self.summary["rl_seconds"]

    @property
    def steps(self) -> int:
        return self.summary["steps"]


def run_local(config: Path, overrides: list[str], label: str, env: dict[str, str] | None = None) -> LocalRun:
    """Runs `rlrun local` in a fresh output folder and reads back its summary and metrics;
    `env` adds to its environment."""
    with tempfile.TemporaryDirectory(prefix=f"rlrun-bench-{label}-") as out:
        argv = [sys.executable, "-m", "rlrun.cli", "local", str(config), "--output-dir", out, "--no-progress"]
        for override in overrides:
            argv += ["--set", override]
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        result = subprocess.run(argv, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise RuntimeError(
                f"`rlrun local` ({label}) failed with code {result.returncode}:\n{result.stderr[-3000:]}"
            )
        summary = json.loads((Path(out) / "summary.json").read_text())
        rows = [
            json.loads(line)
            for line in (Path(out) / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        return LocalRun(summary=summary, rl_rows=[r for r in rows if r.get("phase") == "rl"])


def timing_overrides(steps: int) -> list[str]:
    """The demo's RL loop without warm start or eval: only step time is measured."""
    return [
        f"orchestrator.max_steps={steps}",
        "orchestrator.warm_start.max_steps=0",
        "orchestrator.eval.enabled=false",
        "trainer.checkpoint.interval=0",
    ]
