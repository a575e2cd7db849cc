"""An env whose every rollout fails is loud through `rlrun local`: the first failed rollout's
error, with its env and task, is on the console as soon as the orchestrator has it (before any
step trains), the progress lines count the failed groups, and the run ends naming the env and
its error. The env is a user's own module on PYTHONPATH, without a `name`: its default name
is file-safe (its log file and metric labels carry no `:`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV_MODULE = textwrap.dedent(
    """
    from rlrun.env_server.envs.reverse_text import ReverseText
    from rlrun.env_server import Score


    class Broken(ReverseText):
        \"\"\"Reverse text, with a scorer written as a coroutine by mistake.\"\"\"

        async def score(self, task, episode):
            return Score.of("similarity", 1.0)
    """
)


def test_an_env_whose_every_rollout_fails_is_loud_at_once(tmp_path):
    (tmp_path / "broken_env.py").write_text(ENV_MODULE)
    out = tmp_path / "run"
    settings = {
        "orchestrator.train.env": '[{id = "broken_env:Broken"}]',
        "orchestrator.algorithm_args": "{}",
        "orchestrator.warm_start.max_steps": "0",
        "orchestrator.eval.enabled": "false",
        "orchestrator.batch_size": "4",
        "orchestrator.max_retries": "0",
        "orchestrator.group_failures.window": "8",
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    result = subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "local", str(REPO / "configs" / "reverse_text.toml")]
        + ["--output-dir", str(out), "--max-steps", "3", "--no-progress", *sets],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("rlrun local: a rollout failed: ")]
    assert len(said) == 1, result.stderr[-3000:]
    first = lines[said[0]]
    assert first.startswith("rlrun local: a rollout failed: env 'broken_env-Broken', train task ")
    assert "ScoringError: TypeError: the scorer returned a coroutine, expected a Score (8 rollouts)" in first
    assert f"every failure is logged in {out / 'logs' / 'orchestrator.log'}" in first
    counted = [line for line in lines[said[0] :] if line.startswith("step 0/3 ") and " failed=" in line]
    assert counted, result.stderr[-3000:]
    end = next(i for i, line in enumerate(lines) if line.startswith("rlrun local: the run failed: "))
    assert said[0] < end
    assert "of env 'broken_env-Broken''s last" in lines[end] and "groups failed" in lines[end]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["phase"] == "failed" and summary["steps"] == 0
    assert (out / "logs" / "env-server-broken_env-Broken.stderr").exists()
    assert (out / "logs" / "envs" / "train" / "broken_env-Broken.log").exists()
    assert not any(":" in path.name for path in out.rglob("*"))
