"""Evaluation: fixed held-out tasks rolled out with the eval plan (greedy, or sampled with
pass@k), one result row per rollout, and a summary.

The eval split's first `num_tasks` tasks per env are the eval set (the same every time); the
warm start's dev set is the train split's first `dev_tasks` tasks, which training never samples.

In a multi-agent eval, the env marks the learner's seat of every rollout (trace info
`learner_seat`); the learner won a rollout when its seat's reward is positive (the rewards are
winner-take-all), and the summary's `win_rate` is the share of rollouts it won.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from rlrun.common.wire.trace import TaskRef, Trace
from rlrun.orchestrator.collect.group import LEARNER_SEAT, RolloutGroup
from rlrun.orchestrator.collect.rollouts import EnvRollouts, GroupFailure, run_group


@dataclass
class EvalResult:
    rows: list[dict]
    summary: dict[str, float]


def eval_tasks(counts: dict[str, int], split: str, num_tasks: int) -> list[TaskRef]:
    """The first `num_tasks` tasks of `split` of every env (fewer when the split is smaller)."""
    return [
        TaskRef(env=env, split=split, idx=i)
        for env, count in counts.items()
        for i in range(min(num_tasks, count))
    ]


def completion_text(trace: Trace) -> str:
    return "".join(node.content for node in trace.nodes if node.role == "assistant")


def result_rows(groups: list[RolloutGroup]) -> list[dict]:
    rows = []
    for group in groups:
        for sample, trace in enumerate(group.traces):
            rows.append(
                {
                    "env": group.env,
                    "task_idx": group.task.idx,
                    "example_id": trace.task.example_id,
                    "member_id": trace.member_id,
                    "trained": group.trains(trace),
                    "learner_seat": trace.info.get(LEARNER_SEAT),
                    "sample": sample,
                    "reward": trace.reward,
                    "rewards": {name: c.score for name, c in trace.rewards.items()},
                    "completion": completion_text(trace),
                    "stop_condition": trace.stop_condition,
                    "is_truncated": trace.is_truncated,
                    "policy_span": list(trace.policy_span),
                }
            )
    return rows


def summarize(
    rows: list[dict], k: int, solved_threshold: float, failed_groups: int, name: str = "eval"
) -> dict[str, float]:
    """`<name>_reward`: the mean reward over the trained members' rollouts; pass@k: the fraction
    of tasks where any of the k rollouts reaches `solved_threshold`; also per env. With learner
    seats (multi-agent), `win_rate`: the share of rollouts whose learner seat won."""
    scored = [r for r in rows if r["trained"]]
    by_task: dict[tuple[str, int], list[float]] = defaultdict(list)
    by_env: dict[str, list[float]] = defaultdict(list)
    for row in scored:
        by_task[(row["env"], row["task_idx"])].append(row["reward"])
        by_env[row["env"]].append(row["reward"])
    solved = [max(rewards) >= solved_threshold for rewards in by_task.values()]
    summary = {
        f"{name}_reward": float(np.mean([r["reward"] for r in scored])) if scored else 0.0,
        "pass_at_k": float(np.mean(solved)) if solved else 0.0,
        "k": float(k),
        "tasks": float(len(by_task)),
        "rollouts": float(len(scored)),
        "failed_groups": float(failed_groups),
    }
    for env, rewards in by_env.items():
        summary[f"env/{env}/{name}_reward"] = float(np.mean(rewards))
    learners = [r for r in rows if r.get("learner_seat") is not None and r["member_id"] == r["learner_seat"]]
    if learners:
        summary["win_rate"] = float(np.mean([r["reward"] > 0 for r in learners]))
    return summary


async def run_eval(
    targets: dict[str, EnvRollouts],
    tasks: list[TaskRef],
    *,
    k: int,
    solved_threshold: float,
    concurrency: int,
    max_retries: int,
    timeout_s: float,
    id_prefix: str,
    version: int,
    name: str = "eval",
) -> EvalResult:
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int, task: TaskRef) -> RolloutGroup | GroupFailure:
        async with slots:
            return await run_group(
                targets[task.env],
                f"{id_prefix}-{i:05d}",
                task,
                k,
                version=lambda: version,
                max_retries=max_retries,
                timeout_s=timeout_s,
            )

    async with asyncio.TaskGroup() as running:  # a fatal error cancels the rest
        jobs = [running.create_task(one(i, task)) for i, task in enumerate(tasks)]
    outcomes = [job.result() for job in jobs]
    groups = [o for o in outcomes if isinstance(o, RolloutGroup)]
    rows = result_rows(groups)
    return EvalResult(rows, summarize(rows, k, solved_threshold, len(outcomes) - len(groups), name))
