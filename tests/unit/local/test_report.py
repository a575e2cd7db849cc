"""The reward plot and the final JSON line of a local run."""

import json

from rlrun.local.report import SUMMARY_KEYS, final_summary, read_metrics, reward_series, write_reward_plot
from rlrun.v1 import orchestrator_pb2


def write_metrics(run_dir, rows):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_has_train_and_eval_curves(tmp_path):
    write_metrics(
        tmp_path,
        [
            {"step": 0, "phase": "warmup", "reward_mean": 0.1},
            {"step": 0, "phase": "eval", "eval_reward": 0.55},
            {"step": 1, "phase": "rl", "reward_mean": 0.7},
            {"step": 2, "phase": "rl", "reward_mean": 0.9, "eval_reward": 0.95},
            {"step": 2, "phase": "eval", "eval_reward": 0.95},
        ],
    )
    # Warm-start rewards stay off the RL curve, and each eval is drawn once.
    assert reward_series(read_metrics(tmp_path)) == ([(1, 0.7), (2, 0.9)], [(0, 0.55), (2, 0.95)])
    path = write_reward_plot(tmp_path)
    assert path == tmp_path / "reward_curve.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_metrics_no_plot(tmp_path):
    assert write_reward_plot(tmp_path) is None


def test_final_summary_prefers_the_orchestrator_summary(tmp_path):
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "steps": 100,
                "eval_reward_start": 0.58,
                "eval_reward_end": 0.97,
                "tokens_per_s": 900.0,
                "win_rate_end": 0.7,
            }
        )
    )
    status = orchestrator_pb2.GetRunStatusResponse(step=99, eval_reward=0.5)
    summary = final_summary(tmp_path, status, 41.234)
    assert list(summary)[: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert summary["steps"] == 100 and summary["eval_reward_end"] == 0.97 and summary["wall_s"] == 41.23
    assert summary["win_rate_end"] == 0.7


def test_final_summary_without_summary_uses_status(tmp_path):
    status = orchestrator_pb2.GetRunStatusResponse(step=3, eval_reward=0.4, tokens_per_s=10.0)
    summary = final_summary(tmp_path, status, 1.0)
    assert summary == {
        "steps": 3,
        "eval_reward_start": None,
        "eval_reward_end": 0.4,
        "wall_s": 1.0,
        "tokens_per_s": 10.0,
    }
