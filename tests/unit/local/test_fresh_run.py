"""`rlrun local --fresh` (issue 34 item 1): an earlier run's artifacts, old checkpoints
included, are removed, so a stale `step_246` can never beat a new run's `step_3` for resume
or for keep-N rotation; a folder that is not an rlrun run folder is never deleted."""

from __future__ import annotations

import pytest

from rlrun.local.launcher import RUN_MARKER, clear_run_dir


def test_fresh_removes_every_artifact_of_the_earlier_run_checkpoints_included(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_246").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_246" / "model.safetensors").write_bytes(b"old")
    (run_dir / "rollouts").mkdir()
    (run_dir / "rollouts" / "step_1.jsonl").write_text("{}\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 246}\n')
    (run_dir / RUN_MARKER).write_text("")
    clear_run_dir(run_dir)
    assert not (run_dir / "checkpoints").exists()
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_fresh_refuses_a_folder_that_is_not_a_run_folder(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="holds no"):
        clear_run_dir(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
