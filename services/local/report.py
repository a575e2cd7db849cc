"""What a finished local run leaves behind: the reward-curve plot and the final JSON line."""

from __future__ import annotations

import json
from pathlib import Path

from rlrun.common.run_folder import METRICS, SUMMARY
from rlrun.common.wire.orchestrator import RunStatus

SUMMARY_KEYS = ("steps", "eval_reward_start", "eval_reward_end", "wall_s", "tokens_per_s")


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reward_series(rows: list[dict]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, train reward) of every RL step and (step, eval reward) of every eval."""
    train = [
        (r["step"], r["reward_mean"])
        for r in rows
        if r.get("phase") == "rl" and r.get("reward_mean") is not None
    ]
    evals = [(r["step"], r["eval_reward"]) for r in rows if r.get("phase") == "eval"]
    return train, evals


def write_reward_plot(run_dir: Path) -> Path | None:
    """reward_curve.png: train and eval reward against step (None when nothing was logged)."""
    train, evals = reward_series(read_metrics(run_dir))
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(
            *zip(*train, strict=True), label="train reward (mean over rollouts)", color="tab:blue", alpha=0.8
        )
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="eval reward (held-out)", color="tab:orange")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02 if min(v for _, v in train + evals) >= 0 else None, None)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(run_dir.name)
    fig.tight_layout()
    path = run_dir / "reward_curve.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def final_summary(run_dir: Path, status: RunStatus, wall_s: float) -> dict:
    """The orchestrator's summary.json plus wall time; falls back to the live status."""
    path = run_dir / SUMMARY
    summary = json.loads(path.read_text()) if path.exists() else {}
    out = {
        "steps": summary.get("steps", status.step),
        "eval_reward_start": summary.get("eval_reward_start"),
        "eval_reward_end": summary.get("eval_reward_end", status.eval_reward),
        "wall_s": round(wall_s, 2),
        "tokens_per_s": summary.get("tokens_per_s", status.tokens_per_s),
    }
    for key, value in summary.items():
        if key not in out:
            out[key] = value
    return out
