"""The orchestrator's run against fake env-servers, trainer and inference on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import REGISTRY

from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator import metrics as orchestrator_metrics
from rlrun.orchestrator.run.run import Run


async def execute(config):
    status = RunStatus()
    await Run(config, status).execute()
    return status


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def rl_batches(trainer, warmup_steps=0):
    return [b for b in trainer.batches if b.step >= warmup_steps]


async def test_warm_start_then_rl_writes_every_output(stack, tmp_path):
    config = stack.config(
        tmp_path,
        warm_start={
            "max_steps": 10,
            "target_reward": 0.5,
            "batch_size": 3,
            "lr": 0.003,
            "eval_interval": 1,
            "dev_tasks": 4,
        },
    )
    status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    run_dir = config.run_dir

    # the warm start stops once the dev set reaches the target (fake dev reward 0.6 from version 2)
    steps = [b.step for b in stack.trainer.batches]
    assert steps == list(range(6))
    warm, rl = stack.trainer.batches[:2], stack.trainer.batches[2:]
    assert all(b.learning_rate == 0.003 and len(b.samples) == 3 for b in warm)
    assert all(c.loss == "ce" for b in warm for s in b.samples for c in s.channels)
    assert all(s.logprobs[-3:] == [0.0] * 3 and s.temperatures == [1.0] * 5 for b in warm for s in b.samples)
    assert all(b.learning_rate is None and len(b.samples) == 4 for b in rl)
    assert all({c.loss for s in b.samples for c in s.channels} == {"rl"} for b in rl)
    warm_plans = [c for c in stack.env.calls if c.group_id.startswith("warmup")]
    assert warm_plans and all(c.n == 1 and c.plan.targets[0].model.name == "oracle" for c in warm_plans)
    trained_idx = {c.task.idx for c in stack.env.calls if c.group_id.startswith(("warmup", "rl"))}
    assert min(trained_idx) >= 4  # the dev set is never trained on

    lines = read_lines(run_dir / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in lines] == [
        ("dev", 1),
        ("warmup", 1),
        ("dev", 2),
        ("warmup", 2),
        ("eval", 0),
        ("rl", 1),
        ("eval", 2),
        ("rl", 2),
        ("rl", 3),
        ("eval", 4),
        ("rl", 4),
    ]
    rl_lines = [r for r in lines if r["phase"] == "rl"]
    for key in (
        "reward_mean",
        "tokens",
        "tokens_per_s",
        "off_policy_lag",
        "groups_dropped_stale",
        "filtered_ratio",
        "step_seconds",
        "gen_seconds",
        "train_seconds",
        "batch_build_seconds",
        "trainer/loss",
    ):
        assert all(key in r for r in rl_lines), key
    assert [r["trainer_step"] for r in rl_lines] == [3, 4, 5, 6]
    assert rl_lines[1]["eval_reward"] == lines[6]["eval_reward"]
    assert all(r["off_policy_lag"] <= 1 for r in rl_lines)
    assert lines[1]["dev_reward"] == 0.1 and lines[3]["dev_reward"] == 0.6

    eval_rows = read_lines(run_dir / "eval" / "step_0.jsonl")
    assert len(eval_rows) == 6 and {r["task_idx"] for r in eval_rows} == set(range(6))
    assert len(read_lines(run_dir / "eval" / "dev_step_1.jsonl")) == 4

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["warmup_steps"] == 2 and summary["phase"] == "succeeded"
    assert summary["eval_reward_start"] == lines[4]["eval_reward"] == pytest.approx(0.2)
    assert summary["eval_reward_end"] == lines[9]["eval_reward"] > summary["eval_reward_start"]
    assert summary["train_reward_start"] == 0.5 and summary["train_reward_end"] == 0.5
    assert summary["tokens_per_s"] > 0
    assert stack.trainer.checkpoints[-1][0] == 6  # the final checkpoint
    assert status.step == 4 and status.version == 6


async def test_the_train_reward_counts_rl_batches_only(stack, tmp_path):
    """The warm start's rollouts are the oracle's (reward 1 here): neither the status nor the
    gauge may show that as the policy's reward."""
    config = stack.config(tmp_path, max_steps=2, warm_start={"max_steps": 3, "batch_size": 2})
    status = RunStatus()
    orchestrator_metrics.TRAIN_REWARD.set(-1.0)  # untouched until an RL batch
    run = asyncio.create_task(Run(config, status).execute())
    seen = []
    while not run.done():
        seen.append((status.phase, status.version, status.train_reward, sample(TRAIN_REWARD)))
        await asyncio.sleep(0.001)
    await run
    assert status.phase == "succeeded", status.last_error
    warm = [s for s in seen if s[0] == "warmup"]
    assert any(version >= 1 for _, version, _, _ in warm)  # a warm batch was published
    assert all(reward == 0.0 and shown == -1.0 for _, _, reward, shown in warm)
    assert status.train_reward == 0.5 == sample(TRAIN_REWARD)


async def test_synchronous_mode_trains_only_fresh_rollouts(stack, tmp_path):
    status = await execute(
        stack.config(tmp_path, max_off_policy_steps=0, max_steps=5, eval={"enabled": False})
    )
    assert status.phase == "succeeded", status.last_error
    assert [b.metrics["off_policy_lag"] for b in stack.trainer.batches] == [0.0] * 5
    assert status.groups_dropped_stale == 0


TRAIN_REWARD = "rlrun_orchestrator_train_reward_mean"


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_stale_group_is_dropped_whole_and_in_flight_ones_are_cancelled(stack, tmp_path):
    stack.env.hang_groups = {0}  # the first group never returns on its own
    stack.env.stale_groups = {5}  # a group that returns rollouts 5 versions old
    dropped_before = sample("rlrun_orchestrator_groups_dropped_stale_total", env="reverse-text")
    lags_before = sample("rlrun_orchestrator_off_policy_steps_count")
    status = await execute(stack.config(tmp_path, max_steps=6, eval={"enabled": False}))
    assert status.phase == "succeeded", status.last_error
    [hung] = [c.group_id for c in stack.env.calls if c.group_id.endswith("-000000")]
    assert hung in stack.env.cancels
    assert hung in stack.env.cancelled_in_flight
    assert status.groups_dropped_stale >= 2
    trained_tokens = [t for b in stack.trainer.batches for s in b.samples for t in s.token_ids]
    assert stack.stale_token not in trained_tokens
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["groups_dropped_stale"] == status.groups_dropped_stale
    dropped = sample("rlrun_orchestrator_groups_dropped_stale_total", env="reverse-text") - dropped_before
    assert dropped == status.groups_dropped_stale
    assert (
        sample("rlrun_orchestrator_off_policy_steps_count") - lags_before == 12
    )  # 6 steps x 2 trained groups
    assert sample("rlrun_orchestrator_rl_steps") == 6


async def test_retryable_failures_are_retried_and_others_dropped(stack, tmp_path):
    stack.env.unavailable_groups = {0: 2}
    stack.env.retryable_error_groups = {1: 1}
    stack.env.fatal_error_groups = {2}
    status = await execute(stack.config(tmp_path, eval={"enabled": False}, grpc={"retries": 1}))
    assert status.phase == "succeeded", status.last_error
    attempts = {
        group_id[-1:]: n
        for group_id, n in stack.env.attempts.items()
        if group_id.endswith(("-000000", "-000001", "-000002"))
    }
    assert attempts == {
        "0": 3,
        "1": 2,
        "2": 1,
    }  # UNAVAILABLE twice; retryable trace errors once; a fatal error never
    assert len(stack.trainer.batches) == 4 and all(len(b.samples) == 4 for b in stack.trainer.batches)


async def test_retries_are_bounded_and_endless_failure_fails_the_run(stack, tmp_path):
    stack.env.unavailable_groups = dict.fromkeys(range(1000), -1)
    status = await execute(
        stack.config(tmp_path, max_retries=1, eval={"enabled": False}, grpc={"retries": 1})
    )
    assert status.phase == "failed"
    # by default, the run stops once half of an env's last 64 groups failed: here its first 32
    assert status.last_error.startswith("GroupsFailing: 32 of env 'reverse-text''s last 32 finished groups")
    assert "RunGroup UNAVAILABLE: worker restarting" in status.last_error
    attempts = list(stack.env.attempts.values())
    assert max(attempts) == 2 and attempts.count(2) >= 32  # one try and one retry per dropped group


async def test_batches_that_are_all_filtered_end_in_failed(stack, tmp_path):
    stack.env.sampled_logprob = -0.001  # every rollout is a run of near-certain tokens
    config = stack.config(
        tmp_path, filters={"repetition": {"enabled": True, "window": 3}}, eval={"enabled": False}
    )
    status = await execute(config)
    assert status.phase == "failed"
    assert "every rollout of 3 consecutive batches was filtered" in status.last_error
    assert "repetition flagged 100%" in status.last_error
    assert status.last_error in (tmp_path / "run" / "error.txt").read_text()
    assert stack.trainer.batches == []
    assert len(stack.env.calls) >= 6  # three attempts of two groups


async def test_monitored_filters_still_train(stack, tmp_path):
    stack.env.sampled_logprob = -0.001
    flagged_before = sample(
        "rlrun_orchestrator_filtered_rollouts_total", filter="repetition", env="reverse-text"
    )
    config = stack.config(
        tmp_path,
        filters={"repetition": {"enabled": True, "window": 3, "enforce": False}},
        eval={"enabled": False},
        max_steps=1,
    )
    status = await execute(config)
    assert status.phase == "succeeded"
    assert stack.trainer.batches[0].metrics["filter/repetition_ratio"] == 1.0
    flagged = sample("rlrun_orchestrator_filtered_rollouts_total", filter="repetition", env="reverse-text")
    assert flagged - flagged_before == 4
    assert sample("rlrun_orchestrator_filtered_ratio") == 0.0  # monitored, so none kept from training


async def test_a_failed_step_fails_a_synchronous_run_at_once(stack, tmp_path):
    stack.trainer.reject_step = 1
    config = stack.config(tmp_path, max_off_policy_steps=0, eval={"enabled": False})
    status = await asyncio.wait_for(execute(config), timeout=60)
    assert status.phase == "failed"
    assert status.last_error == "gRPC INVALID_ARGUMENT: batch.samples[0].mask: rejected by the fake"


async def test_skipped_steps_are_taken_again(stack, tmp_path):
    stack.trainer.skip_steps = {1}
    status = await execute(stack.config(tmp_path, max_steps=3, eval={"enabled": False}))
    assert status.phase == "succeeded", status.last_error
    assert [b.step for b in stack.trainer.batches] == [0, 1, 1, 2]
    lines = read_lines(tmp_path / "run" / "metrics.jsonl")
    assert [(r["step"], r["trainer_step"]) for r in lines] == [(1, 1), (2, 2), (3, 3)]


async def test_resume_continues_the_step_sequence(stack, tmp_path):
    trainer = stack.trainer
    config = stack.config(tmp_path, max_steps=6)
    trainer.checkpoint_every = 2
    trainer.crash_at = 3
    run = asyncio.create_task(execute(config))
    await trainer.step_reached.wait()
    run.cancel()  # the orchestrator dies after step 3; the newest checkpoint is step 2
    await asyncio.gather(run, return_exceptions=True)
    assert [s for s, _ in trainer.checkpoints] == [0, 2]
    saved = json.loads(trainer.checkpoints[-1][1])
    assert (saved["rl_steps"], saved["trainer_step"]) == (2, 2)
    first_run_calls = len(stack.env.calls)

    trainer.restart_from_last_checkpoint()
    status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    assert [b.step for b in trainer.batches] == [0, 1, 2, 2, 3, 4, 5]  # step 2 was lost with the crash
    lines = read_lines(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in lines if r["phase"] == "rl"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in lines if r["phase"] == "eval"] == [0, 2, 4, 6]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_reward_start"] == saved["eval_reward_start"] == 0.0
    assert summary["steps"] == 6

    from rlrun.orchestrator.collect.sampler import EnvTasks, TaskSampler

    sampler = TaskSampler([EnvTasks("reverse-text", 1.0, 1000)], seed=0)
    sampler.load_state(saved["sampler"])
    expected = {sampler.sample()[1] for _ in range(4)}
    resumed = [c.task.idx for c in stack.env.calls[first_run_calls:] if c.group_id.startswith("rl")][:4]
    assert set(resumed) == expected  # the sampler continues from its saved state


async def test_a_checkpoint_without_orchestrator_state_is_refused(stack, tmp_path):
    stack.trainer.checkpoints.append((5, b""))  # e.g. saved by hand, or by an older rlrun
    stack.trainer.restart_from_last_checkpoint()
    status = await execute(stack.config(tmp_path))
    assert status.phase == "failed"
    assert (
        "checkpoints/step_5 holds no orchestrator state; start the run over with --fresh" in status.last_error
    )


async def test_a_lost_trainer_sends_the_run_back_to_its_checkpoint(stack, tmp_path):
    """The trainer dies after step 3 and comes back at its step-2 checkpoint: the run goes
    back there, trains steps 3 and 4 again, and its metrics have one line per step."""
    trainer = stack.trainer
    trainer.checkpoint_every = 2
    trainer.crash_at = 3
    run = asyncio.create_task(execute(stack.config(tmp_path, max_steps=5, eval={"enabled": False})))
    await trainer.step_reached.wait()
    trainer.restart_from_last_checkpoint()  # the next SubmitBatch is for a step it lost
    status = await asyncio.wait_for(run, timeout=60)
    assert status.phase == "succeeded", status.last_error
    steps = [b.step for b in trainer.batches]
    assert steps[:3] == [0, 1, 2] and steps[-3:] == [2, 3, 4]
    lines = read_lines(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in lines if r["phase"] == "rl"] == [1, 2, 3, 4, 5]
    assert status.resumes == 1


async def test_multi_agent_env_with_an_algorithm_that_cannot_handle_members_fails_at_startup(stack, tmp_path):
    stack.env.info.members.extend(["debater_a", "debater_b", "judge"])
    config = stack.config(
        tmp_path,
        models={"judge": {"kind": "rule"}},
        members=[
            {"id": "debater_a", "role": "train"},
            {"id": "debater_b", "role": "fixed", "model": "judge"},
            {"id": "judge", "role": "fixed", "model": "judge"},
        ],
    )
    status = await execute(config)
    assert status.phase == "failed"
    assert (
        "env 'reverse-text' is multi-agent (members: debater_a, debater_b, judge) but algorithm 'grpo'"
        in status.last_error
    )
    assert stack.env.calls == []


async def test_env_owned_algorithms_run_through_run_algorithms(stack, tmp_path):
    stack.env.info.algorithms.append("length_bonus")
    status = await execute(
        stack.config(tmp_path, algorithms=["length_bonus"], max_steps=2, eval={"enabled": False})
    )
    assert status.phase == "succeeded", status.last_error
    assert len(stack.env.algorithm_calls) == 4 and list(stack.env.algorithm_calls[0].algorithms) == [
        "length_bonus"
    ]
    sample = stack.trainer.batches[0].samples[0]
    assert [(c.loss, c.values) for c in sample.channels] == [("rl", [0.0, 0.0, 2.0, 2.0, 2.0])]


async def test_env_owned_results_of_the_wrong_length_fail_the_run(stack, tmp_path):
    stack.env.info.algorithms.append("length_bonus")
    stack.env.algorithm_mask_length_error = True
    status = await execute(
        stack.config(tmp_path, algorithms=["grpo", "length_bonus"], eval={"enabled": False})
    )
    assert status.phase == "failed"
    assert "results[0].mask has 4 entries but the branch has 5" in status.last_error
    assert stack.trainer.batches == []


async def test_an_unknown_algorithm_fails_at_startup_naming_it_and_the_env(stack, tmp_path):
    status = await execute(stack.config(tmp_path, algorithms=["grpo", "nope"]))
    assert status.phase == "failed"
    assert "algorithm 'nope' for env 'reverse-text' is neither builtin" in status.last_error


async def test_two_envs_share_the_batches_by_ratio(stack, tmp_path):
    envs = [{"id": "reverse-text", "ratio": 1.0}, {"id": "arithmetic", "ratio": 1.0}]
    status = await execute(
        stack.config(tmp_path, env=envs, max_steps=6, eval={"num_tasks": 2, "interval": 0})
    )
    assert status.phase == "succeeded", status.last_error
    assert all(c.task.env == "reverse-text" for c in stack.envs[0].calls)
    assert all(c.task.env == "arithmetic" for c in stack.envs[1].calls)
    assert len(stack.envs[0].calls) > 2 and len(stack.envs[1].calls) > 2
    line = read_lines(tmp_path / "run" / "metrics.jsonl")[0]
    assert (line["phase"], line["tasks"]) == ("eval", 4)


async def test_opd_scores_through_the_reference_with_its_concurrency_cap(stack, tmp_path):
    stack.inference.delay = 0.02
    config = stack.config(
        tmp_path,
        algorithms=["opd"],
        max_steps=2,
        eval={"enabled": False},
        group_size=4,
        models={"reference": {"addresses": [stack.addresses["inference"]], "max_concurrency": 2}},
    )
    status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    assert stack.inference.peak == 2
    sample = stack.trainer.batches[0].samples[0]
    assert sample.channels[0].values == [0.0, 0.0, 0.25, 0.25, 0.25]  # -0.25 - (-0.5)
