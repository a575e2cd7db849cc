"""Seed-parity behaviours of the orchestrator's run (issue 34), against the fake env-servers,
trainer and inference of conftest.py on 127.0.0.1."""

from __future__ import annotations

import json
import logging

from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.run.run import Run


async def execute(config):
    status = RunStatus()
    await Run(config, status).execute()
    return status


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_saved_rollouts_record_whether_they_were_filtered_and_by_which_filters(stack, tmp_path):
    """Every trace is near-certain (repetition flags all, monitored: they still train); the
    first trace of group 0 also samples a token outside the vocabulary (out_of_vocabulary,
    enforced: it never trains)."""
    stack.env.sampled_logprob = -0.001
    stack.env.oov_groups = {0}
    config = stack.config(
        tmp_path,
        max_steps=1,
        max_off_policy_steps=0,
        save_rollouts_interval=1,
        filters={"repetition": {"enabled": True, "window": 3, "enforce": False}},
        eval={"enabled": False},
    )
    status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    rows = read_lines(tmp_path / "run" / "rollouts" / "step_1.jsonl")
    assert len(rows) == 4
    oov = [r for r in rows if stack.oov_token in r["nodes"][1]["tokenIds"]]
    assert len(oov) == 1
    assert oov[0]["isFiltered"] is True
    assert oov[0]["filters"] == ["out_of_vocabulary", "repetition"]
    others = [r for r in rows if r is not oov[0]]
    assert all(r["isFiltered"] is False and r["filters"] == ["repetition"] for r in others)
    assert len(stack.trainer.batches[0].samples) == 3  # the flagged one never trained


async def test_saved_rollouts_no_filter_flagged_say_so(stack, tmp_path):
    config = stack.config(tmp_path, max_steps=1, save_rollouts_interval=1, eval={"enabled": False})
    assert (await execute(config)).phase == "succeeded"
    rows = read_lines(tmp_path / "run" / "rollouts" / "step_1.jsonl")
    assert rows and all(r["isFiltered"] is False and r["filters"] == [] for r in rows)


LOW = "rlrun.orchestrator.run.recorder"


async def test_a_batch_where_at_most_a_tenth_trains_is_warned_about(stack, tmp_path, caplog):
    """10 single-rollout groups, 9 of them out of vocabulary: 1 of 10 rollouts (10%) trains."""
    stack.env.oov_groups = set(range(1, 10))
    config = stack.config(
        tmp_path, max_steps=1, batch_size=10, group_size=1, max_off_policy_steps=0, eval={"enabled": False}
    )
    with caplog.at_level(logging.WARNING, logger=LOW):
        status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    assert len(stack.trainer.batches[0].samples) == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == LOW]
    assert warnings == ["only 10% of the batch's 10 rollouts train (filtered 90%)"]


async def test_a_batch_where_more_than_a_tenth_trains_is_not_warned_about(stack, tmp_path, caplog):
    """8 of 10 out of vocabulary: 20% trains, above the bound."""
    stack.env.oov_groups = set(range(2, 10))
    config = stack.config(
        tmp_path, max_steps=1, batch_size=10, group_size=1, max_off_policy_steps=0, eval={"enabled": False}
    )
    with caplog.at_level(logging.WARNING, logger=LOW):
        assert (await execute(config)).phase == "succeeded"
    assert len(stack.trainer.batches[0].samples) == 2
    assert [r for r in caplog.records if r.name == LOW] == []


async def test_run_algorithms_carries_the_algorithm_settings_and_the_model_endpoints(stack, tmp_path):
    stack.env.info.algorithms.append("length_bonus")
    reference = stack.addresses["inference"]
    config = stack.config(
        tmp_path,
        algorithms=["length_bonus"],
        algorithm_args={"length_bonus": {"coef": 0.5, "target": "reference"}},
        models={"reference": {"addresses": [reference]}},
        max_steps=1,
        eval={"enabled": False},
    )
    status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    request = stack.env.algorithm_calls[0]
    assert json.loads(request.algorithm_args["length_bonus"]) == {"coef": 0.5, "target": "reference"}
    endpoints = {m.name: list(m.addresses) for m in request.models}
    assert endpoints == {"policy": [stack.addresses["inference"]], "reference": [reference]}


async def test_run_algorithms_without_settings_sends_none(stack, tmp_path):
    stack.env.info.algorithms.append("length_bonus")
    config = stack.config(tmp_path, algorithms=["length_bonus"], max_steps=1, eval={"enabled": False})
    assert (await execute(config)).phase == "succeeded"
    request = stack.env.algorithm_calls[0]
    assert dict(request.algorithm_args) == {}
    assert [m.name for m in request.models] == ["policy"]


def eval_lines(tmp_path):
    return [r for r in read_lines(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "eval"]


async def test_eval_envs_of_their_own_run_with_their_own_sampling_interval_and_task_count(stack, tmp_path):
    """Training on reverse-text (envs[0]); evaluating only arithmetic (envs[1]), every 3 steps,
    2 tasks, at most 5 tokens, greedily."""
    config = stack.config(
        tmp_path,
        max_steps=4,
        eval={
            "interval": 1,
            "num_tasks": 6,
            "env": [
                {
                    "id": "arithmetic",
                    "address": stack.addresses["envs"][1],
                    "interval": 3,
                    "num_tasks": 2,
                    "sampling": {"max_completion_tokens": 5},
                }
            ],
        },
    )
    status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    assert not [
        c for c in stack.envs[0].calls if c.group_id.startswith("eval")
    ]  # the train env is not evaluated
    evals = stack.envs[1].calls
    assert evals and all(c.group_id.startswith("eval") and c.task.split == "eval" for c in evals)
    assert all(c.plan.targets[0].sampling.max_tokens == 5 for c in evals)
    assert all(c.plan.targets[0].sampling.temperature == 0 for c in evals)
    lines = eval_lines(tmp_path)
    assert [r["step"] for r in lines] == [0, 3, 4]  # before RL, its interval, the end
    assert all(r["tasks"] == 2 and "env/arithmetic/eval_reward" in r for r in lines)
    assert all(r["env"] == "arithmetic" for r in read_lines(tmp_path / "run" / "eval" / "step_3.jsonl"))


async def test_each_eval_env_falls_due_at_its_own_interval(stack, tmp_path):
    config = stack.config(
        tmp_path,
        max_steps=4,
        eval={
            "num_tasks": 2,
            "env": [
                {
                    "id": "reverse-text",
                    "name": "rt-eval",
                    "address": stack.addresses["envs"][0],
                    "interval": 2,
                },
                {"id": "arithmetic", "address": stack.addresses["envs"][1], "interval": 3},
            ],
        },
    )
    status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    evaluated = {
        r["step"]: sorted(k.split("/")[1] for k in r if k.startswith("env/") and k.endswith("/eval_reward"))
        for r in eval_lines(tmp_path)
    }
    assert evaluated == {
        0: ["arithmetic", "rt-eval"],
        2: ["rt-eval"],
        3: ["arithmetic"],
        4: ["arithmetic", "rt-eval"],
    }


async def test_without_eval_envs_the_training_envs_eval_split_is_evaluated(stack, tmp_path):
    config = stack.config(tmp_path, max_steps=2, eval={"num_tasks": 3, "interval": 1})
    assert (await execute(config)).phase == "succeeded"
    lines = eval_lines(tmp_path)
    assert [r["step"] for r in lines] == [0, 1, 2]
    assert all(r["tasks"] == 3 and "env/reverse-text/eval_reward" in r for r in lines)
