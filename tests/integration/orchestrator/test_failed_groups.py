"""Bad input inside a run never ends it: the orchestrator's real run against a fake env-server
(a grpc.aio servicer on 127.0.0.1) that answers INTERNAL or INVALID_ARGUMENT for some groups,
or returns a token outside the vocabulary. Only a sustained failure rate stops the run."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import grpc
from prometheus_client import REGISTRY

from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.run.run import Run

ENV = "reverse-text"


async def execute(config):
    """The run's status; a run that spins on failing groups instead of stopping fails the test."""
    status = RunStatus()
    await asyncio.wait_for(Run(config, status).execute(), timeout=60)
    return status


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def failed_groups(reason):
    return sample("rlrun_orchestrator_groups_failed_total", env=ENV, reason=reason)


def attempts_of(env, index):
    [n] = [
        n
        for group_id, n in env.attempts.items()
        if group_id.startswith("rl-") and group_id.endswith(f"-{index:06d}")
    ]
    return n


async def test_a_group_answering_internal_or_invalid_argument_is_retried_dropped_and_counted(
    stack, tmp_path, caplog
):
    stack.env.abort_groups = {1: grpc.StatusCode.INTERNAL, 3: grpc.StatusCode.INVALID_ARGUMENT}
    before = {reason: failed_groups(reason) for reason in ("internal", "invalid_argument")}
    config = stack.config(tmp_path, max_retries=2, eval={"enabled": False})
    with caplog.at_level(logging.WARNING, logger="rlrun.orchestrator.collect.rollouts"):
        status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    assert (attempts_of(stack.env, 1), attempts_of(stack.env, 3)) == (3, 3)  # one try, two retries
    assert {reason: failed_groups(reason) - n for reason, n in before.items()} == {
        "internal": 1,
        "invalid_argument": 1,
    }
    drops = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(drops) == 2
    assert re.fullmatch(
        rf"group rl-\w+-t0-000001 on env {ENV} dropped after 3 attempt\(s\): "
        r"RunGroup INTERNAL: the fake env fails group rl-\w+-t0-000001",
        drops[0] if "000001" in drops[0] else drops[1],
    )
    # every step still trained a full batch, from the groups that succeeded
    assert [len(b.samples) for b in stack.trainer.batches] == [4, 4, 4, 4]


async def test_a_sustained_failure_rate_stops_the_run_naming_the_env_and_the_last_error(stack, tmp_path):
    stack.env.abort_groups = dict.fromkeys(range(2, 1000), grpc.StatusCode.INTERNAL)
    config = stack.config(
        tmp_path, max_retries=1, group_failures={"window": 8, "max_ratio": 0.5}, eval={"enabled": False}
    )
    status = await execute(config)
    assert status.phase == "failed"
    assert re.fullmatch(
        rf"GroupsFailing: 4 of env '{ENV}''s last \d finished groups failed "
        r"\(orchestrator.group_failures: max_ratio 0.5 over a window of 8\); the last, rl-\w+-t\d+-\d+, "
        r"after 2 attempt\(s\): RunGroup INTERNAL: the fake env fails group rl-\w+-t\d+-\d+",
        status.last_error,
    ), status.last_error
    assert status.last_error in (tmp_path / "run" / "error.txt").read_text()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["phase"] == "failed"


async def test_an_env_that_refuses_every_group_stops_the_run_at_the_default_rate(stack, tmp_path):
    """Eval included: its groups are left out of the eval, and the RL phase stops the run."""
    stack.env.abort_code = grpc.StatusCode.INVALID_ARGUMENT
    status = await execute(stack.config(tmp_path))
    assert status.phase == "failed"
    assert status.last_error.startswith(
        f"GroupsFailing: 32 of env '{ENV}''s last 32 finished groups failed "
        "(orchestrator.group_failures: max_ratio 0.5 over a window of 64); the last, "
    )
    assert status.last_error.endswith("after 4 attempt(s): RunGroup INVALID_ARGUMENT: the fake env refuses")
    [eval_line] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert (eval_line["phase"], eval_line["failed_groups"], eval_line["rollouts"]) == ("eval", 6.0, 0.0)


async def test_one_env_failing_among_healthy_ones_stops_the_run(stack, tmp_path):
    """Each env has its own window: half the run's groups succeed, but all of arithmetic's fail."""
    stack.envs[1].abort_groups = dict.fromkeys(range(1000), grpc.StatusCode.INTERNAL)
    config = stack.config(
        tmp_path,
        max_retries=0,
        max_steps=50,
        group_failures={"window": 8, "max_ratio": 0.75},
        env=[{"id": "reverse-text"}, {"id": "arithmetic"}],
        eval={"enabled": False},
    )
    status = await execute(config)
    assert status.phase == "failed"
    assert status.last_error.startswith(
        "GroupsFailing: 6 of env 'arithmetic''s last 6 finished groups failed"
    )


async def test_a_status_that_no_group_could_pass_still_fails_the_run_at_once(stack, tmp_path):
    """A wiring fault (here UNIMPLEMENTED) is not bad input: it surfaces at once, unretried."""
    stack.env.abort_code = grpc.StatusCode.UNIMPLEMENTED
    status = await execute(stack.config(tmp_path, eval={"enabled": False}))
    assert status.phase == "failed"
    assert status.last_error == "gRPC UNIMPLEMENTED: the fake env refuses"
    assert set(stack.env.attempts.values()) == {1}


async def test_an_eval_group_answering_internal_is_left_out_of_the_eval(stack, tmp_path):
    stack.env.abort_eval_tasks = {2: grpc.StatusCode.INTERNAL}
    status = await execute(stack.config(tmp_path, max_steps=2, max_retries=1))
    assert status.phase == "succeeded", status.last_error
    evals = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if '"phase": "eval"' in line
    ]
    assert [(e["step"], e["failed_groups"], e["tasks"]) for e in evals] == [(0, 1.0, 5.0), (2, 1.0, 5.0)]
    rows = (tmp_path / "run" / "eval" / "step_2.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["task_idx"] for r in rows) == [0, 1, 3, 4, 5]


async def test_a_token_outside_the_vocabulary_never_reaches_the_trainer(stack, tmp_path, caplog):
    stack.env.oov_groups = {1}
    flagged = "rlrun_orchestrator_filtered_rollouts_total"
    before = sample(flagged, filter="out_of_vocabulary", env=ENV)
    config = stack.config(tmp_path, eval={"enabled": False})
    with caplog.at_level(logging.WARNING, logger="rlrun.orchestrator.credit.batching"):
        status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    trained = [b for b in stack.trainer.batches]
    assert all(t < stack.oov_token for b in trained for s in b.samples for t in s.token_ids)
    assert sum(len(b.samples) for b in trained) == 4 * 4 - 1  # only the one trace is dropped
    assert sample(flagged, filter="out_of_vocabulary", env=ENV) - before == 1
    [message] = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(
        rf"env {ENV}, group (rl-\w+-t0-000001): trace \1/0 never trains \(out_of_vocabulary\): "
        rf"nodes\[1\]\.token_ids\[0\] = {stack.oov_token} is outside the model's vocabulary \(vocab_size 128\)",
        message,
    ), message
    [line] = [b.metrics for b in trained if "filter/out_of_vocabulary_ratio" in b.metrics]
    assert line["filter/out_of_vocabulary_ratio"] == 0.25
