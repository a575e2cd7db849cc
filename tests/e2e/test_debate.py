"""`rlrun local configs/debate.toml`: a real multi-agent run (inference, env-server, trainer and
orchestrator as processes on loopback) that finishes and reports the learner seat's win rates;
the full run (slow) must raise the win rate against the fixed opponent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def rlrun_local(output_dir: Path, *args: str, timeout_s: float) -> tuple[dict, dict]:
    """Runs `rlrun local configs/debate.toml ARGS`; returns its last stdout line (JSON) and summary.json."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrun.cli",
            "local",
            "configs/debate.toml",
            "--no-progress",
            "--output-dir",
            str(output_dir),
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    return last, json.loads((output_dir / "summary.json").read_text())


def test_a_short_debate_run_finishes_and_reports_win_rates(tmp_path):
    last, summary = rlrun_local(
        tmp_path / "run",
        "--max-steps",
        "3",
        "--set",
        "orchestrator.warm_start.max_steps=4",
        "--set",
        "orchestrator.eval.num_tasks=16",
        "--set",
        "orchestrator.batch_size=4",
        timeout_s=240,
    )
    assert last["phase"] == "succeeded" and last["steps"] == 3 and last["warmup_steps"] == 4
    for key in ("win_rate_start", "win_rate_end"):
        assert 0.0 <= last[key] <= 1.0 and last[key] == summary[key]
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "eval" / "step_3.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 16 * 3 and {r["learner_seat"] for r in rows} == {"debater_a"}
    assert {r["member_id"] for r in rows if r["trained"]} == {"debater_a"}


@pytest.mark.slow
def test_the_learner_wins_more_often_over_the_run(tmp_path):
    last, _ = rlrun_local(tmp_path / "run", timeout_s=1200)
    assert last["phase"] == "succeeded"
    assert last["win_rate_end"] >= last["win_rate_start"] + 0.1, last
