"""`rlrun eval` (issue 34 item 12) through the real CLI: a checkpoint written with the trainer's
save code is evaluated on the reverse_text eval split; Ctrl-C (SIGINT) stops it with the
finished tasks on disk, and the same command resumes, running only the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlrun.common.config import load_config
from rlrun.common.model.load import arch_dict
from rlrun.trainer.checkpoint import save_checkpoint
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs/reverse_text.toml"
TASKS = 96


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    config = load_config(CONFIG, [f"output_dir={json.dumps(str(tmp_path / 'train'))}"])
    learner = build_learner(config, Parallelism.single())
    return save_checkpoint(
        tmp_path / "train" / "checkpoints", learner.capture_state(), b"", arch_dict(config.model), 1, 1
    )


def command(checkpoint: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlrun.cli",
        "eval",
        str(CONFIG),
        "--checkpoint",
        str(checkpoint),
        "--output-dir",
        str(out),
        "--num-tasks",
        str(TASKS),
        "--set",
        "orchestrator.max_inflight_groups=2",
    ]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_eval_a_checkpoint_interrupt_and_resume(checkpoint, tmp_path):
    out = tmp_path / "eval"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen(
        command(checkpoint, out), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while len(lines(out / "results.jsonl")) < 3 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr[-3000:]
    assert "Run the same command again to resume" in stderr
    done = {(r["env"], r["task_idx"]) for r in lines(out / "results.jsonl")}
    assert 3 <= len(done) < TASKS, len(done)
    assert not (out / "metrics.json").exists()

    second = subprocess.run(
        [*command(checkpoint, out), "--no-progress"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming: {len(done)} tasks already in" in second.stderr
    records = lines(out / "results.jsonl")
    keys = [(r["env"], r["task_idx"]) for r in records]
    # Every task once: the ones done before the interrupt were not run again.
    assert sorted(keys) == [("reverse-text", i) for i in range(TASKS)]
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary == json.loads((out / "metrics.json").read_text())
    assert summary["tasks"] == summary["rollouts"] == TASKS and summary["failed_groups"] == 0
    rewards = [row["reward"] for r in records for row in r["rows"]]
    assert summary["eval_reward"] == pytest.approx(sum(rewards) / len(rewards))
    table = second.stdout.splitlines()
    assert table[0].split() == ["metric", "value"]
    assert any(line.split() == ["tasks", str(TASKS)] for line in table)
    assert any(line.split()[0] == "eval_reward" for line in table)
    assert json.loads((out / "eval_config.json").read_text())["model"] == str(checkpoint.resolve())
    assert (out / "logs" / "inference.log").exists()


def test_help_and_refusals(tmp_path):
    def rlrun(*argv):
        return subprocess.run(
            [sys.executable, "-m", "rlrun.cli", *argv], cwd=REPO, capture_output=True, text=True, timeout=60
        )

    shown = rlrun("eval", "--help")
    assert shown.returncode == 0
    for phrase in ("--checkpoint", "--endpoint", "results.jsonl", "resumes", "summary table"):
        assert phrase in " ".join(shown.stdout.split()), phrase
    both = rlrun("eval", str(CONFIG), "--checkpoint", "x", "--endpoint", "http://h/v1")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    (tmp_path / "empty").mkdir()
    bad = rlrun(
        "eval", str(CONFIG), "--checkpoint", str(tmp_path / "empty"), "--output-dir", str(tmp_path / "o")
    )
    assert bad.returncode == 2 and "neither a trainer checkpoint" in bad.stderr


def test_eval_an_openai_compatible_endpoint(tmp_path):
    """--endpoint: the debate's learner seat played by a real `rlrun serve inference --http-port 0`
    through its OpenAI API (an openai-kind target); no inference service is started."""
    import re

    from rlrun.common.service import serve_command
    from rlrun.local.processes import ProcessGroup

    debate = REPO / "configs/debate.toml"
    group = ProcessGroup(dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        argv = serve_command(
            "inference", debate, tmp_path / "api", "--set", f"output_dir={json.dumps(str(tmp_path / 'api'))}"
        )
        child = group.start("api", [*argv, "--http-port", "0"], tmp_path / "api" / "inference.log")
        deadline, url = time.monotonic() + 30, None
        while url is None and time.monotonic() < deadline:
            found = re.search(r"OpenAI-compatible HTTP on (http://\S+/v1)", child.stderr_file.read_text())
            url = found.group(1) if found else time.sleep(0.2)
        assert url, child.stderr_file.read_text()[-2000:]
        out = tmp_path / "eval"
        result = subprocess.run(
            [sys.executable, "-m", "rlrun.cli", "eval", str(debate), "--endpoint", url]
            + ["--output-dir", str(out), "--num-tasks", "8", "--no-progress"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        group.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["tasks"] == 8 and summary["failed_groups"] == 0 and "win_rate" in summary
    assert not (out / "logs" / "inference.log").exists()
    rows = [row for r in lines(out / "results.jsonl") for row in r["rows"]]
    assert {row["member_id"] for row in rows} == {"debater_a", "debater_b", "judge"}


FLAKY_ENV = textwrap.dedent(
    """
    from pathlib import Path

    from rlrun.env_server.envs.reverse_text import ReverseText


    class Flaky(ReverseText):
        \"\"\"Reverse text whose every third eval task fails while `fail_file` exists.\"\"\"

        def __init__(self, fail_file: str, **kwargs):
            super().__init__(**kwargs)
            self.fail_file = Path(fail_file)

        def score(self, task, episode):
            if task.idx % 3 == 0 and self.fail_file.exists():
                raise RuntimeError(f"task {task.idx} fails while {self.fail_file} exists")
            return super().score(task, episode)
    """
)


def test_resume_reruns_the_failed_tasks_of_the_eval_envs_and_counts_each_once(checkpoint, tmp_path):
    """The config's [[orchestrator.eval.env]] entries are what `rlrun eval` runs (each with its
    own num_tasks; the training env is not evaluated). A first eval fails every third task of
    the flaky env; the same command again runs those tasks only, and each task counts once."""
    (tmp_path / "flaky_env.py").write_text(FLAKY_ENV)
    fail_file = tmp_path / "fail"
    fail_file.write_text("")
    config = tmp_path / "eval_envs.toml"
    config.write_text(
        CONFIG.read_text()
        + textwrap.dedent(
            f"""
            [[orchestrator.eval.env]]
            id = "flaky_env:Flaky"
            name = "flaky"
            args = {{ fail_file = {json.dumps(str(fail_file))}, eval_size = 12 }}
            num_tasks = 12

            [[orchestrator.eval.env]]
            id = "reverse-text"
            name = "rt-eval"
            num_tasks = 5
            """
        )
    )
    out = tmp_path / "eval"
    argv = [sys.executable, "-m", "rlrun.cli", "eval", str(config), "--checkpoint", str(checkpoint)]
    argv += ["--output-dir", str(out), "--no-progress", "--set", "orchestrator.max_retries=0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tmp_path))

    def run() -> tuple[subprocess.CompletedProcess, dict]:
        result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result, json.loads(result.stdout.strip().splitlines()[-1])

    first, summary = run()
    failing = {("flaky", i) for i in range(0, 12, 3)}
    wanted = {("flaky", i) for i in range(12)} | {("rt-eval", i) for i in range(5)}
    records = lines(out / "results.jsonl")
    assert {(r["env"], r["task_idx"]) for r in records} == wanted
    assert {(r["env"], r["task_idx"]) for r in records if r.get("failed")} == failing
    assert all("fails while" in r["failed"] for r in records if r.get("failed"))
    assert summary["failed_groups"] == len(failing)
    assert summary["tasks"] == len(wanted) - len(failing)
    assert not (out / "logs" / "env-server-reverse-text.log").exists()  # the training env

    fail_file.unlink()
    second, summary = run()
    done = len(wanted) - len(failing)
    assert f"resuming: {done} tasks already in" in second.stderr
    assert f"{len(failing)} failed there and run again" in second.stderr
    records = lines(out / "results.jsonl")
    keys = [(r["env"], r["task_idx"]) for r in records]
    # Only the failed tasks ran again (one more line each); the newest line of each counts.
    assert sorted(keys) == sorted([*wanted, *failing])
    assert not any(r.get("failed") for r in records[len(wanted) :])
    assert summary["tasks"] == summary["rollouts"] == len(wanted) and summary["failed_groups"] == 0
    newest = {(r["env"], r["task_idx"]): r for r in records}
    rewards = [row["reward"] for r in newest.values() for row in r["rows"]]
    assert summary["eval_reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert set(summary) >= {"env/flaky/eval_reward", "env/rt-eval/eval_reward"}
    assert "env/reverse-text/eval_reward" not in summary
