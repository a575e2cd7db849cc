"""`rlrun local` end to end: real services as processes on loopback, a real (short) run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlrun.dashboard import registry
from rlrun.dashboard.runs import run_id

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "reverse_text.toml"
SUMMARY_KEYS = {"steps", "eval_reward_start", "eval_reward_end", "wall_s", "tokens_per_s"}


def rlrun_local(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "local", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def rlrun_children(run_dir: Path) -> list[int]:
    """Pids of the `rlrun serve` processes of the run in `run_dir` still alive (their command
    lines name its log folder)."""
    out = subprocess.run(["pgrep", "-f", f"serve .*{run_dir}/logs"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def test_short_run_learns_and_writes_its_outputs(tmp_path):
    out = tmp_path / "run"
    steps = 30
    result = rlrun_local(
        str(DEMO),
        "--output-dir",
        str(out),
        "--max-steps",
        str(steps),
        "--set",
        f"orchestrator.eval.interval={steps}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(summary) >= SUMMARY_KEYS
    assert summary["steps"] == steps
    assert summary["eval_reward_start"] <= 0.6  # the warm start leaves room to learn
    # Seeds 0-3 of the demo gain 0.08-0.19 held-out greedy reward in their first 20-30 RL
    # steps (docs/learning.md); 0.05 leaves room for scheduling noise between services.
    assert summary["eval_reward_end"] > summary["eval_reward_start"] + 0.05, summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == list(range(1, steps + 1))
    assert {"reward_mean", "tokens_per_s", "off_policy_lag", "step_seconds"} <= set(rl[-1])
    assert (out / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (out / "eval").glob("step_*.jsonl"))
    assert any((out / "checkpoints").iterdir())
    for service in ("inference", "trainer", "orchestrator", "env-server-reverse-text"):
        assert (out / "logs" / f"{service}.stderr").exists(), service
    assert not rlrun_children(out)


def test_a_child_that_dies_is_named_and_nothing_is_left_behind(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(DEMO.read_text().replace('id = "reverse-text"', 'id = "no-such-env"'))
    result = rlrun_local(str(bad), "--output-dir", str(tmp_path / "run"), timeout=300)
    assert result.returncode == 1
    assert "env-server-no-such-env" in result.stderr
    assert str(tmp_path / "run" / "logs") in result.stderr
    assert not rlrun_children(tmp_path / "run")
    # The dashboard's address came first (the session's dashboard, started or reused), and
    # the run is registered with it.
    server = registry.live_server()
    assert server is not None
    assert f"rlrun local: dashboard {server['url']}/#run={run_id(tmp_path / 'run')}" in result.stderr
    assert (tmp_path / "run").resolve() in registry.registered()


def test_no_dashboard_registers_nothing_and_starts_none(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.HOME_ENV, str(tmp_path / "home"))
    bad = tmp_path / "bad.toml"
    bad.write_text(DEMO.read_text().replace('id = "reverse-text"', 'id = "no-such-env"'))
    result = rlrun_local(str(bad), "--output-dir", str(tmp_path / "run"), "--no-dashboard", timeout=300)
    assert result.returncode == 1 and "rlrun local: dashboard" not in result.stderr
    assert registry.registered() == [] and registry.live_server() is None


@pytest.mark.slow
def test_the_demo_reaches_its_target(tmp_path):
    result = rlrun_local(str(DEMO), "--output-dir", str(tmp_path / "run"), timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["eval_reward_start"] <= 0.6
    assert summary["eval_reward_end"] >= 0.95
