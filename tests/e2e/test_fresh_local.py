"""`rlrun local --fresh` on a used run folder, through the real command (issue 48 item 6):
the earlier run's folder goes (its checkpoints, metrics, rollouts, logs, eval results), the new
run starts at step 1 and never resumes; what lies outside that folder (a sibling run, the
user's files next to it) is kept; a folder that is no run folder is never deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "reverse_text.toml"


def rlrun_local(out: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "local", str(DEMO), "--output-dir", str(out)]
        + ["--max-steps", str(steps), "--no-progress", "--no-dashboard"]
        + ["--set", "trainer.checkpoint.interval=1", "--set", "trainer.checkpoint.keep=10"]
        + ["--set", "orchestrator.warm_start.max_steps=2", "--set", "orchestrator.eval.num_tasks=8"]
        + ["--set", "orchestrator.batch_size=8", *extra],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def rl_steps(run: Path) -> list[int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r["phase"] == "rl"]


def checkpoint_steps(run: Path) -> set[int]:
    return {int(p.name.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*")}


def eval_steps(run: Path) -> set[int]:
    return {int(p.stem.removeprefix("step_")) for p in (run / "eval").glob("step_*.jsonl")}


def test_fresh_deletes_the_earlier_run_and_keeps_what_is_not_its_own(tmp_path):
    run = tmp_path / "outputs" / "reverse_text"
    first = rlrun_local(run, 4)
    assert first.returncode == 0, first.stderr[-3000:]
    assert rl_steps(run) == [1, 2, 3, 4]
    old_checkpoints = checkpoint_steps(run)
    assert max(old_checkpoints) > 4  # trainer steps: warm start + 4 RL steps
    old_log = (run / "logs" / "trainer.stderr").read_text()
    assert max(eval_steps(run)) == 4
    sibling = tmp_path / "outputs" / "other_run"
    sibling.mkdir()
    (sibling / "notes.txt").write_text("another run's")
    (tmp_path / "outputs" / "README").write_text("mine")
    (run / "stray.txt").write_text("inside the run folder")

    again = rlrun_local(run, 2)  # without --fresh: the same folder resumes
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming {run} from step 4" in again.stderr
    assert rl_steps(run) == [1, 2, 3, 4]  # already past max_steps: nothing new
    before_fresh = checkpoint_steps(run)

    fresh = rlrun_local(run, 2, "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert f"--fresh: deleted the earlier run in {run}" in fresh.stderr
    assert "resuming" not in fresh.stderr
    # Deleted: every artifact of the earlier run; the new one counts from step 1.
    assert rl_steps(run) == [1, 2]
    new_checkpoints = checkpoint_steps(run)
    assert max(new_checkpoints) < max(before_fresh)  # the old newest one is gone
    assert max(eval_steps(run)) == 2  # the eval of step 4 is gone
    assert not (run / "stray.txt").exists()
    assert (run / "logs" / "trainer.stderr").read_text() != old_log
    # Kept: what is outside the run folder.
    assert (sibling / "notes.txt").read_text() == "another run's"
    assert (tmp_path / "outputs" / "README").read_text() == "mine"
    summary = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2


def test_fresh_refuses_a_folder_that_is_no_run_folder(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    result = rlrun_local(tmp_path, 2, "--fresh")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "holds no resolved_config.json" in result.stderr
    assert "choose another --output-dir" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["precious.txt"]
    assert (tmp_path / "precious.txt").read_text() == "keep me"
