"""Eval summaries: mean reward over trained members and pass@k per task."""

from __future__ import annotations

import pytest

from rlrun.common.wire.trace import TaskRef
from rlrun.orchestrator.collect.evaluation import eval_tasks, result_rows, summarize


def row(env, idx, reward, trained=True):
    return {"env": env, "task_idx": idx, "reward": reward, "trained": trained}


def test_pass_at_k_counts_a_task_solved_when_any_sample_reaches_the_threshold():
    rows = [
        row("a", 0, 0.2),
        row("a", 0, 1.0),
        row("a", 1, 0.5),
        row("a", 1, 0.9),
        row("b", 0, 1.0),
        row("b", 0, 0.0, trained=False),
    ]
    summary = summarize(rows, k=2, solved_threshold=0.9, failed_groups=1)
    assert summary["pass_at_k"] == pytest.approx(1.0)
    summary = summarize(rows, k=2, solved_threshold=1.0, failed_groups=1)
    assert summary["pass_at_k"] == pytest.approx(2 / 3)
    assert summary["eval_reward"] == pytest.approx((0.2 + 1.0 + 0.5 + 0.9 + 1.0) / 5)
    assert (summary["tasks"], summary["rollouts"], summary["failed_groups"], summary["k"]) == (3, 5, 1, 2)
    assert summary["env/a/eval_reward"] == pytest.approx(0.65)
    assert summarize(rows, 2, 1.0, 0, name="dev")["dev_reward"] == summary["eval_reward"]


def test_the_eval_set_is_the_first_tasks_of_the_split():
    assert eval_tasks({"a": 3, "b": 10}, "eval", 2) == [
        TaskRef("a", "eval", 0),
        TaskRef("a", "eval", 1),
        TaskRef("b", "eval", 0),
        TaskRef("b", "eval", 1),
    ]
    assert len(eval_tasks({"a": 3}, "train", 64)) == 3


def test_rows_carry_the_completion_and_membership(build):
    t = build.trace("t", 0.75)
    t.nodes[1].content = "cba"
    [r] = result_rows([build.group([t])])
    assert (r["completion"], r["reward"], r["trained"], r["member_id"], r["sample"]) == (
        "cba",
        0.75,
        True,
        "policy",
        0,
    )
