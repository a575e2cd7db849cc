"""Chaos: kill -9 the services of a real `rlrun local` run while it trains, as Kubernetes kills
pods. The launcher restarts each on its port; the run must still complete, with one metrics
line per step (no gap, no duplicate), the final policy version equal to the trainer steps
taken, and a rising eval reward. Ctrl-C stops after a step with a checkpoint, and the same
command resumes."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "reverse_text.toml"
SERVICES = ("env-server", "inference", "trainer", "orchestrator")


def launch(out: Path, steps: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "rlrun.cli", "local", str(DEMO), "--output-dir", str(out)]
    argv += ["--max-steps", str(steps), "--no-progress", "--set", f"orchestrator.eval.interval={steps}"]
    argv += ["--set", "trainer.checkpoint.interval=3", *extra]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env
    )


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def rl_step(out: Path) -> int:
    return max((r["step"] for r in rows(out) if r["phase"] == "rl"), default=0)


def service_pids(out: Path, service: str = "") -> list[int]:
    """The `rlrun serve` processes of the run in `out` (their command lines name its log folder)."""
    pattern = f"rlrun.cli serve {service}.*{out}/logs" if service else f"serve .*{out}/logs"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def wait_for_step(launcher: subprocess.Popen, out: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while rl_step(out) < step:
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no rl step {step} within {timeout}s"
        time.sleep(0.2)


def kill(out: Path, service: str) -> None:
    [pid] = service_pids(out, service)
    os.kill(pid, signal.SIGKILL)


def finish(launcher: subprocess.Popen, timeout: float = 600) -> tuple[dict, str]:
    stdout, stderr = launcher.communicate(timeout=timeout)
    assert launcher.returncode == 0, stderr[-4000:]
    return json.loads(stdout.strip().splitlines()[-1]), stderr


def assert_complete_and_learning(out: Path, summary: dict, steps: int) -> None:
    rl = [r["step"] for r in rows(out) if r["phase"] == "rl"]
    assert rl == list(range(1, steps + 1)), rl  # no gap, no duplicate
    assert summary["phase"] == "succeeded" and summary["steps"] == steps
    assert summary["policy_version"] == summary["trainer_steps"], summary
    assert summary["eval_reward_end"] > summary["eval_reward_start"], summary
    assert not service_pids(out)


def test_a_run_survives_kill_9_of_each_service(tmp_path):
    out, steps = tmp_path / "run", 20
    launcher = launch(out, steps)
    for at, service in zip((3, 7, 11, 15), SERVICES, strict=True):
        wait_for_step(launcher, out, at)
        kill(out, service)
    summary, stderr = finish(launcher)
    for service in SERVICES:
        restarted = rf"rlrun local: {service}\S* \(pid \d+\) was killed by SIGKILL; restarting it \(1 of 5\)"
        assert re.search(restarted, stderr), (service, stderr[-4000:])
    assert_complete_and_learning(out, summary, steps)


LORA = [
    "--set=trainer.lora.rank=16",
    "--set=trainer.lora.alpha=32.0",
    "--set=trainer.lora.train_embeddings=true",
    "--set=trainer.lora.train_head=true",
]
"""A LoRA variant of the demo (its model is too small for adapters alone to learn much: the
embeddings and the head train in full too)."""


def test_a_lora_run_survives_kill_9_of_the_trainer_and_resumes_with_its_adapters(tmp_path):
    out, steps = tmp_path / "run", 20
    launcher = launch(out, steps, *LORA)
    wait_for_step(launcher, out, 7)  # past the checkpoint of step 6
    kill(out, "trainer")
    summary, stderr = finish(launcher)
    assert re.search(r"rlrun local: trainer\S* \(pid \d+\) was killed by SIGKILL; restarting it", stderr)
    log = (out / "logs" / "trainer.log").read_text()
    assert "resumed from" in log, log[-3000:]
    assert all((path / "adapter").is_dir() for path in (out / "checkpoints").glob("step_*"))
    assert_complete_and_learning(out, summary, steps)


def test_a_service_that_keeps_dying_ends_the_run_at_the_restart_limit(tmp_path):
    out = tmp_path / "run"
    launcher = launch(out, 50, "--max-restarts", "1")
    wait_for_step(launcher, out, 1)
    [first] = service_pids(out, "env-server")
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 120
    log = out / "logs" / "env-server-reverse-text.stderr"
    while log.read_text().count("env-server listening on") < 2:  # the restarted one is ready
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.2)
    kill(out, "env-server")
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 1
    assert "env-server-reverse-text was killed by SIGKILL, and was restarted 1 times already" in stderr
    assert not service_pids(out)


def test_ctrl_c_stops_after_a_step_with_a_checkpoint_and_the_same_command_resumes(tmp_path):
    out, steps = tmp_path / "run", 10
    launcher = launch(out, steps)
    wait_for_step(launcher, out, 4)
    assert len(service_pids(out)) == 4
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, stderr[-3000:]
    assert "stopping after the current step" in stderr and "Run the same command again to resume" in stderr
    assert not service_pids(out)
    stopped_at = rl_step(out)
    assert 4 <= stopped_at < steps

    summary, stderr = finish(launch(out, steps))
    assert f"resuming {out} from step {stopped_at} (trainer step" in stderr  # its checkpoint is the last step
    assert_complete_and_learning(out, summary, steps)


@pytest.mark.slow
def test_a_longer_run_survives_a_random_kill_every_few_steps(tmp_path):
    out, steps = tmp_path / "run", 60
    launcher = launch(out, steps, "--max-restarts", "20")
    picks = random.Random(0)
    for at in range(4, steps - 4, 5):
        wait_for_step(launcher, out, at)
        kill(out, picks.choice(SERVICES))
    summary, _ = finish(launcher, timeout=1800)
    assert_complete_and_learning(out, summary, steps)
