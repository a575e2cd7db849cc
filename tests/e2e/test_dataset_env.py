"""The built-in `dataset` env end to end (issue 33 item 4): configs/dataset_words.toml, its
shipped data file and its eval-only env ([[orchestrator.eval.env]], issue 34 item 9), trained a
few steps through `rlrun local`.

What is checked is that the run completes with sensible rewards, not that the reward rises:
four RL steps of small batches move a 108k-parameter model too little to tell a rise from
noise (the demo's recipe needs 20-30 steps of 64 prompts for that, tests/e2e/test_local.py).
Sensible means: every training reward is the similarity scorer's (in [0, 1]) and above zero
after the warm start (the answers resemble the reversed words), and the eval env reports an
exact-match accuracy in [0, 1] over its held-out words."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "dataset_words.toml"


def test_the_dataset_example_trains_through_rlrun_local(tmp_path):
    out = tmp_path / "run"
    settings = {
        "orchestrator.batch_size": 16,
        "orchestrator.eval.num_tasks": 16,
        "orchestrator.eval.interval": 2,
        "orchestrator.warm_start.max_steps": 6,
        "orchestrator.warm_start.batch_size": 32,
        "orchestrator.warm_start.dev_tasks": 16,
        "orchestrator.save_rollouts_interval": 4,
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
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
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3, 4]
    assert all(0.0 < r["reward_mean"] <= 1.0 and r["env/words/reward_mean"] == r["reward_mean"] for r in rl)
    evals = [r for r in rows if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(0.0 <= r["env/words-exact/eval_reward"] <= 1.0 and r["tasks"] == 16 for r in evals)
    assert "env/words/eval_reward" not in evals[0]  # the training env is not evaluated: the eval env is
    eval_rows = [json.loads(line) for line in (out / "eval" / "step_4.jsonl").read_text().splitlines()]
    assert {r["env"] for r in eval_rows} == {"words-exact"}
    assert all(r["rewards"].keys() == {"exact"} for r in eval_rows)
    rollouts = [json.loads(line) for line in (out / "rollouts" / "step_4.jsonl").read_text().splitlines()]
    assert rollouts and all("similarity" in r["rewards"] and "isFiltered" in r for r in rollouts)
    words = {
        json.loads(line)["word"] for line in (REPO / "configs/data/words.jsonl").read_text().splitlines()
    }
    assert all(r["nodes"][0]["content"] in words for r in rollouts if r["nodes"][0]["role"] == "ROLE_USER")
    for service in ("env-server-words", "env-server-words-exact"):
        assert (out / "logs" / f"{service}.stderr").exists(), service
