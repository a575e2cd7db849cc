"""Seed-parity behaviours of the orchestrator's run (issue 34), against the fake env-servers,
trainer and inference of conftest.py on 127.0.0.1."""

from __future__ import annotations

import json
import logging

from rlrun.orchestrator.run import Run
from rlrun.orchestrator.status import RunStatus


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


LOW = "rlrun.orchestrator.recorder"


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
