"""A multi-agent run of the orchestrator against a fake debate env-server, the fake trainer and
inference on 127.0.0.1: who trains, ema_per_member's checkpointed baselines (and resume with
and without them), int example ids end to end, and the win rates of the summary."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlrun.common.config import resolve_config
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.common.wire.plan import plan_from_proto
from rlrun.common.wire.trace import Branch, MessageNode, Trace, task_from_proto, trace_to_proto
from rlrun.orchestrator.run.run import Run
from rlrun.v1 import env_pb2, env_pb2_grpc

ENV_SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name
MEMBERS = ("debater_a", "debater_b", "judge")
MEMBER_TOKEN = {"debater_a": 20, "debater_b": 30, "judge": 40}
"""Each member's completion token, so a training sample tells whose trace it came from."""


class FakeDebateEnv(env_pb2_grpc.EnvServiceServicer):
    """RunGroup answers one trace per member per rollout. The learner (debater_a) wins the even
    rollouts of a train group and loses the odd ones; on eval it wins from policy version 2 on.
    Example ids are ints (1000 + task index). `mark_seat` = False leaves learner_seat out."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.mark_seat = True
        self.calls: list[env_pb2.RunGroupRequest] = []

    async def GetInfo(self, request, context):
        info = env_pb2.EnvInfo(
            env_id="debate", task_counts={"train": 1000, "eval": 4}, members=list(MEMBERS), temperature=1.0
        )
        return env_pb2.GetInfoResponse(envs=[info])

    async def RunGroup(self, request, context):
        self.calls.append(request)
        plan = plan_from_proto(request.plan)
        assert sorted(plan.targets) == sorted(MEMBERS)
        task = task_from_proto(request.task)
        task.example_id = 1000 + task.idx
        task.data = "{}"
        traces = []
        for i in range(request.n):
            if task.split == "eval":
                learner = 1.0 if self.trainer.version >= 2 else -1.0
            else:
                learner = 1.0 if i % 2 == 0 else -1.0
            rewards = {"debater_a": learner, "debater_b": -learner, "judge": 0.0}
            for member in MEMBERS:
                rule = plan.targets[member].model.kind == "rule"
                nodes = [
                    MessageNode("u", "user", [3, 10 + task.idx % 20], [False, False]),
                    MessageNode(
                        "a",
                        "assistant",
                        [MEMBER_TOKEN[member], 1],
                        [True, True],
                        [0.0 if rule else -0.5] * 2,
                        parent="u",
                    ),
                ]
                traces.append(
                    Trace(
                        id=f"{request.group_id}/{i}/{member}",
                        task=task,
                        nodes=nodes,
                        branches=[Branch(["u", "a"])],
                        rollout_id=f"{request.group_id}/{i}",
                        group_id=request.group_id,
                        member_id=member,
                        reward=rewards[member],
                        policy_span=(self.trainer.version, self.trainer.version),
                        stop_condition="completed",
                        info={"learner_seat": "debater_a"} if self.mark_seat else {},
                    )
                )
        return env_pb2.RunGroupResponse(traces=[trace_to_proto(t) for t in traces])

    async def Cancel(self, request, context):
        return env_pb2.CancelResponse(cancelled=len(request.group_ids))


def debate_config(stack, tmp_path, address, **orchestrator):
    raw = stack.raw(
        tmp_path,
        env=[{"id": "debate"}],
        models={"opponent": {"kind": "rule"}, "judge": {"kind": "rule"}},
        members=[
            {"id": "debater_a", "role": "train"},
            {"id": "debater_b", "role": "fixed", "model": "opponent"},
            {"id": "judge", "role": "fixed", "model": "judge"},
        ],
        algorithms=["ema_per_member"],
        multi_agent={"filter_by_learner_seat": True},
        **orchestrator,
    )
    raw["orchestrator"]["train"]["env"][0]["address"] = address
    return resolve_config(raw)[0]


async def execute(config):
    status = RunStatus()
    await Run(config, status).execute()
    return status


async def test_only_the_learner_trains_and_the_summary_has_win_rates(stack, serve, tmp_path):
    env = FakeDebateEnv(stack.trainer)
    async with serve(ENV_SERVICE, env_pb2_grpc.add_EnvServiceServicer_to_server, env) as address:
        config = debate_config(
            stack, tmp_path, address, warm_start={"max_steps": 1, "batch_size": 2, "dev_tasks": 2}
        )
        status = await execute(config)
    assert status.phase == "succeeded", status.last_error
    warm, *rl = stack.trainer.batches
    # Every sample is the learner's: the opponent and the judge never train.
    for batch in stack.trainer.batches:
        assert {s.token_ids[2] for s in batch.samples} == {MEMBER_TOKEN["debater_a"]}
    assert len(warm.samples) == 2 and all(c.loss == "ce" for s in warm.samples for c in s.channels)
    warm_calls = [c for c in env.calls if c.group_id.startswith("warmup")]
    assert {t.member_id: t.model.name for t in warm_calls[0].plan.targets} == {
        "debater_a": "oracle",
        "debater_b": "opponent",
        "judge": "judge",
    }
    # RAE on the first RL group (rewards +1, -1 for one key): A = 0.9, then -1 - (0.09 - 0.1) = -0.99.
    first = rl[0].samples[:2]
    advantages = [next(v for v, m in zip(s.channels[0].values, s.mask, strict=True) if m) for s in first]
    assert advantages == pytest.approx([0.9, -0.99])

    summary = json.loads((config.run_dir / "summary.json").read_text())
    assert (summary["win_rate_start"], summary["win_rate_end"]) == (0.0, 1.0)
    rows = [json.loads(line) for line in (config.run_dir / "eval" / "step_0.jsonl").read_text().splitlines()]
    assert {r["member_id"] for r in rows} == set(MEMBERS) and {r["learner_seat"] for r in rows} == {
        "debater_a"
    }
    assert {r["example_id"] for r in rows} == {1000, 1001, 1002, 1003}  # int ids stay ints
    saved = json.loads(stack.trainer.checkpoints[-1][1])
    baselines = saved["algorithms"]["ema_per_member"]["baselines"]
    assert baselines and all(
        env == "debate" and isinstance(ex, int) and m == "debater_a" for env, ex, m, _ in baselines
    )


async def test_resume_restores_the_baselines_and_refuses_a_checkpoint_without_them(stack, serve, tmp_path):
    env = FakeDebateEnv(stack.trainer)
    trainer = stack.trainer
    async with serve(ENV_SERVICE, env_pb2_grpc.add_EnvServiceServicer_to_server, env) as address:
        config = debate_config(
            stack,
            tmp_path,
            address,
            max_steps=4,
            eval={"enabled": False},
        )
        trainer.checkpoint_every = 2
        trainer.crash_at = 3
        run = asyncio.create_task(execute(config))
        await trainer.step_reached.wait()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        step, state = trainer.checkpoints[-1]
        saved = json.loads(state)["algorithms"]["ema_per_member"]["baselines"]
        assert step == 2 and len(saved) == 4  # two groups of two steps, one key each

        trainer.restart_from_last_checkpoint()
        status = await execute(config)
        assert status.phase == "succeeded", status.last_error
        resumed = json.loads(trainer.checkpoints[-1][1])["algorithms"]["ema_per_member"]["baselines"]
        assert [row[:3] for row in resumed[:4]] == [row[:3] for row in saved]  # kept, then extended
        assert len(resumed) == 8

        without = json.loads(state)
        without["algorithms"] = {}
        trainer.checkpoints = [(2, json.dumps(without).encode())]
        trainer.restart_from_last_checkpoint()
        status = await execute(config)
    assert status.phase == "failed"
    assert "ema_per_member: the checkpoint holds no saved baselines" in status.last_error


async def test_a_rollout_without_learner_seat_fails_the_run_when_the_filter_is_on(stack, serve, tmp_path):
    env = FakeDebateEnv(stack.trainer)
    env.mark_seat = False
    async with serve(ENV_SERVICE, env_pb2_grpc.add_EnvServiceServicer_to_server, env) as address:
        status = await execute(debate_config(stack, tmp_path, address, eval={"enabled": False}))
    assert status.phase == "failed"
    assert "has no `learner_seat`" in status.last_error and "filter_by_learner_seat" in status.last_error
    assert stack.trainer.batches == []
