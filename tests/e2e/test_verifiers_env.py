"""A verifiers v1 environment trained through `rlrun local` (issue 33 item 3): the small env
package tests/support/vf_envs/vf_reverse_text (a Taskset with a `@vf.reward`, an in-process chat
Harness), put on the env-server's path as verifiers finds packages, run as `id =
"vf:vf_reverse_text"` with tests/support/vf_envs/vf_reverse_text.toml (the demo's model and
recipe). rlrun local starts the policy replica with its HTTP API; the env-server's verifiers
train client renders with the `renderers` renderer over configs/tokenizer/lowercase and
generates through /inference/v1/generate; the traces train.

A few RL steps of small batches cannot show the reward rising on this CPU (tests/e2e/
test_dataset_env.py says the same of the built-in env); what is checked is that the run trains
on verifiers' rollouts with verifiers' reward: the warm start on the env's reference answers
lifts the reward above zero, every RL step trains, every reward is the task's `similarity`
in [0, 1], and the saved rollouts are verifiers' traces (their info names the verifiers trace).
The rise itself was measured by hand on the full config (docs/verifiers.md)."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

importlib.import_module("verifiers.v1")

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "tests" / "support" / "vf_envs"
CONFIG = ENVS / "vf_reverse_text.toml"


def test_a_verifiers_env_trains_through_rlrun_local(tmp_path):
    out = tmp_path / "run"
    settings = {
        "orchestrator.batch_size": 16,
        "orchestrator.eval.num_tasks": 16,
        "orchestrator.eval.interval": 2,
        "orchestrator.warm_start.max_steps": 8,
        "orchestrator.warm_start.batch_size": 32,
        "orchestrator.warm_start.dev_tasks": 16,
        "orchestrator.save_rollouts_interval": 2,
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ENVS), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrun.cli",
            "local",
            str(CONFIG),
            "--output-dir",
            str(out),
            "--max-steps",
            "4",
        ]
        + sets
        + ["--no-progress"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["phase"] == "succeeded"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3, 4]
    assert all(
        0.0 < r["reward_mean"] <= 1.0 and r["env/vf-reverse/reward_mean"] == r["reward_mean"] for r in rl
    )
    assert 0.0 < summary["dev_reward"] <= 1.0  # the warm start learned from the reference answers
    rollouts = [
        json.loads(line)
        for path in sorted((out / "rollouts").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert rollouts
    assert all(set(r["rewards"]) == {"similarity"} for r in rollouts), rollouts[0]
    assert all(r["info"]["verifiers_trace_id"] for r in rollouts)
    log = (out / "logs" / "inference.log").read_text()
    assert "/inference/v1/generate" in log or "OpenAI-compatible HTTP on" in log
