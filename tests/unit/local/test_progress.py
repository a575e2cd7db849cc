"""What `rlrun local` shows while it runs: the latest eval with its step, failed and stale
groups as they are counted, and the first failed rollout at once, said once."""

from __future__ import annotations

from pathlib import Path

from rlrun.common.config import load_config
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.local.progress import RunProgress, fields

REPO = Path(__file__).resolve().parents[3]
CONFIG = load_config(REPO / "configs" / "reverse_text.toml", ["orchestrator.max_steps=20"])


def status(**kw) -> RunStatus:
    return RunStatus(**{"phase": "running", **kw})


def test_the_eval_is_shown_with_the_step_it_was_measured_after():
    assert "eval" not in fields(status(step=3))
    assert fields(status(step=12, eval_reward=0.8125, eval_step=10, eval_split="eval"))["eval"] == "0.812@10"
    warm = fields(status(phase="warmup", eval_reward=0.5, eval_step=6, eval_split="dev"))
    assert warm["dev"] == "0.500@6" and "eval" not in warm


def test_failed_and_stale_groups_show_once_there_are_any():
    assert "failed" not in fields(status()) and "stale" not in fields(status())
    shown = fields(status(groups_failed=3, groups_dropped_stale=2))
    assert shown["failed"] == 3 and shown["stale"] == 2


def test_without_a_bar_a_new_eval_gets_its_line_at_once(capsys):
    progress = RunProgress(CONFIG, enabled=False)
    progress.update(status(step=9, eval_reward=0.5, eval_step=0, eval_split="eval"))
    progress.update(status(step=10, eval_reward=0.5, eval_step=0, eval_split="eval"))
    # The eval after step 10 finishes after step 10's line: it gets a line of its own.
    progress.update(status(step=10, eval_reward=0.75, eval_step=10, eval_split="eval"))
    progress.update(status(step=11, eval_reward=0.75, eval_step=10, eval_split="eval"))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "step 9/20 phase=rl reward=0.000 eval=0.500@0 tok/s=0 lag=0",
        "step 10/20 phase=rl reward=0.000 eval=0.500@0 tok/s=0 lag=0",
        "step 10/20 phase=rl reward=0.000 eval=0.750@10 tok/s=0 lag=0",
    ]


def test_the_first_failed_rollout_is_said_once_with_its_env_task_and_log(capsys, tmp_path):
    error = "env 'letters', train task 7: trace errors: HarnessError: TypeError: not async (8 rollouts)"
    for enabled in (False, True):
        progress = RunProgress(CONFIG, enabled=enabled, log=tmp_path / "orchestrator.log")
        progress.update(status(step=0))
        progress.update(status(step=0, first_rollout_error=error, groups_failed=1))
        progress.update(status(step=0, first_rollout_error=error, groups_failed=4))
        progress.close()
        said = [line for line in capsys.readouterr().err.splitlines() if "a rollout failed" in line]
        assert len(said) == 1, said
        assert said[0].startswith(f"rlrun local: a rollout failed: {error} (a failing group is retried")
        assert f"every failure is logged in {tmp_path / 'orchestrator.log'}" in said[0]
