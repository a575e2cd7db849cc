"""Multi-agent credit: ema_per_member (RAE) against hand-computed sequences, its checkpointed
state, the judge and learner-seat filters, plan compilation, the startup check, and the eval's
win rate."""

from __future__ import annotations

import json

import pytest

from rlrun.common.config import ConfigError, resolve_config
from rlrun.common.wire.trace import TaskRef
from rlrun.orchestrator.collect.evaluation import result_rows, summarize
from rlrun.orchestrator.credit.algorithms import AlgorithmDeps, builtin
from rlrun.orchestrator.credit.pipeline import CreditPipelines, EnvAlgorithmSpec
from rlrun.orchestrator.run.outputs import trace_row
from rlrun.orchestrator.run.plan import compile_plans, trained_members
from rlrun.orchestrator.run.state import OrchestratorState

DEBATE = ("debater_a", "debater_b", "judge")


def ema(alpha=None):
    return builtin("ema_per_member")({} if alpha is None else {"alpha": alpha}, AlgorithmDeps())


def advantage(trace) -> float:
    """The one advantage the rl channel holds on every sampled token of the trace."""
    [branch] = trace.branches
    [channel] = [c for c in branch.channels if c.loss == "rl"]
    sampled = [v for v, m in zip(channel.values, branch.mask, strict=True) if m]
    assert len(set(sampled)) == 1 and not any(
        v for v, m in zip(channel.values, branch.mask, strict=True) if not m
    )
    return sampled[0]


def keyed(build, tid, reward, env="debate", example="max(1,2)", member="debater_a", **info):
    trace = build.trace(tid, reward, member=member, env=env)
    trace.task.example_id = example
    trace.info.update(info)
    return trace


def members_group(build, traces, env="debate", trained=("debater_a",), **kwargs):
    group = build.group(traces, env=env, trained=frozenset(trained))
    for key, value in kwargs.items():
        setattr(group, key, value)
    return group


# -- RAE -------------------------------------------------------------------------------------------


def test_a_cold_baseline_is_updated_before_it_is_subtracted(build):
    trace = keyed(build, "t", 1.0)
    ema(alpha=0.9).credit(members_group(build, [trace]))
    assert advantage(trace) == pytest.approx(0.9)  # b = 0.9·0 + 0.1·1 = 0.1, A = 1 − 0.1


def test_repeated_keys_within_a_group_compound_per_trajectory(build):
    traces = [keyed(build, f"t{i}", r) for i, r in enumerate([1.0, 0.0, 1.0, -1.0])]
    algorithm = ema(alpha=0.9)
    algorithm.credit(members_group(build, traces))
    # b1 = 0.1         A1 = 1 − 0.1    = 0.9
    # b2 = 0.09        A2 = 0 − 0.09   = −0.09
    # b3 = 0.081 + 0.1 = 0.181    A3 = 1 − 0.181   = 0.819
    # b4 = 0.1629 − 0.1 = 0.0629  A4 = −1 − 0.0629 = −1.0629
    assert [advantage(t) for t in traces] == pytest.approx([0.9, -0.09, 0.819, -1.0629])
    # The next group with the same key goes on from b4.
    later = keyed(build, "later", 0.5)
    algorithm.credit(members_group(build, [later]))
    assert advantage(later) == pytest.approx(0.5 - (0.9 * 0.0629 + 0.05))


def test_baselines_are_kept_apart_by_task_example_and_member(build):
    traces = [
        keyed(build, "base", 1.0),
        keyed(build, "other-env", 1.0, env="debate-2"),
        keyed(build, "other-example", 1.0, example="max(3,4)"),
        keyed(build, "int-example", 1.0, example=7),
        keyed(build, "str-example", 1.0, example="7"),  # a str id is not the int with its digits
        keyed(build, "other-member", 1.0, member="debater_b"),
    ]
    algorithm = ema(alpha=0.9)
    for trace in traces:  # one group each: the group's env is the task of the key
        algorithm.credit(members_group(build, [trace], env=trace.task.env, trained=[trace.member_id]))
    assert [advantage(t) for t in traces] == pytest.approx([0.9] * 6)
    assert len(algorithm.baselines) == 6


def test_alpha_is_configurable_and_checked(build):
    trace = keyed(build, "t", 2.0)
    ema(alpha=0.5).credit(members_group(build, [trace]))
    assert advantage(trace) == pytest.approx(1.0)  # b = 0.5·2
    assert ema().args.alpha == 0.9
    with pytest.raises(ConfigError, match="algorithm_args.ema_per_member"):
        ema(alpha=1.5)


def test_a_trace_without_an_example_id_is_an_error(build):
    trace = keyed(build, "t", 1.0, example=None)
    with pytest.raises(ValueError, match="no example id"):
        ema().credit(members_group(build, [trace]))


# -- checkpointed state ------------------------------------------------------------------------------


def pipelines(ids=("ema_per_member",), members=DEBATE):
    spec = EnvAlgorithmSpec(env="debate", env_id="debate", ids=list(ids), owned=[], members=list(members))

    async def no_env_algorithms(env_id, algorithm_ids, traces):
        raise AssertionError("RunAlgorithms must not be called")

    return CreditPipelines([spec], {}, AlgorithmDeps(), no_env_algorithms)


async def test_resume_with_saved_state_continues_every_baseline(build):
    before = pipelines()
    await before.apply(members_group(build, [keyed(build, "a", 1.0, example=7), keyed(build, "b", -1.0)]))
    state = OrchestratorState(trainer_step=3, policy_version=3, algorithms=before.state_dict())
    restored = OrchestratorState.from_bytes(state.to_bytes())  # through JSON, as in a checkpoint
    after = pipelines()
    after.load_state_dict(restored.algorithms)
    [algorithm] = after.instances.values()
    assert algorithm.baselines == {
        ("debate", 7, "debater_a"): pytest.approx(0.1),
        ("debate", "max(1,2)", "debater_a"): pytest.approx(-0.1),
    }
    again = keyed(build, "c", 1.0, example=7)
    await after.apply(members_group(build, [again]))
    assert advantage(again) == pytest.approx(1.0 - (0.09 + 0.1))


def test_resume_without_saved_state_is_an_error_not_a_cold_start():
    with pytest.raises(ValueError, match="ema_per_member: the checkpoint holds no saved baselines"):
        pipelines().load_state_dict({})
    # State is saved even before the first baseline exists, so an early checkpoint resumes too.
    fresh = pipelines()
    assert fresh.state_dict() == {"ema_per_member": {"baselines": []}}
    pipelines().load_state_dict(json.loads(json.dumps(fresh.state_dict())))


# -- who trains --------------------------------------------------------------------------------------


def config(**orchestrator):
    raw = {
        "inference": {"addresses": ["127.0.0.1:1001"]},
        "orchestrator": {
            "train": {"env": [{"id": "debate"}]},
            "models": {"opponent": {"kind": "rule"}, "judge": {"kind": "rule"}},
            "members": [
                {"id": "debater_a", "role": "train"},
                {"id": "debater_b", "role": "fixed", "model": "opponent"},
                {"id": "judge", "role": "fixed", "model": "judge"},
            ],
            "algorithms": ["ema_per_member"],
            **orchestrator,
        },
    }
    return resolve_config(raw)[0]


def test_a_debate_compiles_to_a_learner_a_fixed_opponent_and_a_fixed_judge():
    plans = compile_plans(config(warm_start={"max_steps": 4}))
    train = plans.train["debate"]
    assert {k: (t.role, t.model.name, t.model.kind) for k, t in train.targets.items()} == {
        "debater_a": ("train", "policy", "inference"),
        "debater_b": ("fixed", "opponent", "rule"),
        "judge": ("fixed", "judge", "rule"),
    }
    # The warm start's oracle plays the learner's seat; the opponent and judge stay as they are.
    warm = plans.warmup["debate"]
    assert {k: (t.role, t.model.name) for k, t in warm.targets.items()} == {
        "debater_a": ("train", "oracle"),
        "debater_b": ("fixed", "opponent"),
        "judge": ("fixed", "judge"),
    }
    assert trained_members(train) == trained_members(warm) == {"debater_a"}


def test_drop_judge_excludes_a_trained_judge():
    cfg = config(
        members=[
            {"id": "debater_a", "role": "train"},
            {"id": "debater_b", "role": "train"},
            {"id": "judge", "role": "train"},
        ]
    )
    plan = compile_plans(cfg).train["debate"]
    assert trained_members(plan) == set(DEBATE)
    assert trained_members(plan, drop_judge=True) == {"debater_a", "debater_b"}
    assert cfg.orchestrator.multi_agent.drop_judge  # the default


def test_the_learner_seat_filter_trains_only_the_marked_seat(build):
    traces = [
        keyed(build, "0/a", 1.0, member="debater_a", learner_seat="debater_a"),
        keyed(build, "0/b", -1.0, member="debater_b", learner_seat="debater_a"),
        keyed(build, "1/a", -1.0, member="debater_a", learner_seat="debater_b"),
        keyed(build, "1/b", 1.0, member="debater_b", learner_seat="debater_b"),
    ]
    self_play = members_group(build, traces, trained=("debater_a", "debater_b"))
    assert [t.id for t in self_play.trained_traces] == ["0/a", "0/b", "1/a", "1/b"]
    self_play.learner_seat_only = True
    assert [t.id for t in self_play.trained_traces] == ["0/a", "1/b"]
    ema().credit(self_play)
    assert [bool(t.branches[0].channels) for t in traces] == [True, False, False, True]


def test_with_the_filter_on_a_rollout_without_a_learner_seat_is_an_error(build):
    group = members_group(build, [keyed(build, "0/a", 1.0)], learner_seat_only=True)
    with pytest.raises(ValueError, match="has no `learner_seat`.*filter_by_learner_seat"):
        ema().credit(group)


def test_the_learner_seat_filter_needs_members():
    with pytest.raises(ConfigError, match="filter_by_learner_seat needs a multi-agent run"):
        resolve_config(
            {
                "orchestrator": {
                    "train": {"env": [{"id": "reverse-text"}]},
                    "multi_agent": {"filter_by_learner_seat": True},
                }
            }
        )


def test_an_algorithm_that_cannot_handle_members_fails_at_startup_naming_both():
    with pytest.raises(ConfigError) as caught:
        pipelines(ids=("ema_per_member", "grpo"))
    message = str(caught.value)
    assert (
        "env 'debate' is multi-agent (members: debater_a, debater_b, judge) but algorithm 'grpo'" in message
    )
    assert "ema_per_member" in message  # it suggests the ones that can
    assert [a.name for a in pipelines().pipelines["debate"]] == ["ema_per_member"]


def test_ema_per_member_on_a_single_agent_env_fails_at_startup_naming_both():
    with pytest.raises(ConfigError) as caught:
        pipelines(members=())
    assert caught.value.path == "orchestrator.algorithms"
    assert (
        "algorithm 'ema_per_member' keeps one baseline per member, but env 'debate' is single-agent"
        in str(caught.value)
    )


# -- the eval's win rate ------------------------------------------------------------------------------


def test_the_win_rate_counts_the_rollouts_the_learner_seat_won(build):
    def rollout(i, learner_reward, seat="debater_a"):
        other = "debater_b" if seat == "debater_a" else "debater_a"
        return [
            keyed(build, f"{i}/{seat}", learner_reward, member=seat, learner_seat=seat),
            keyed(build, f"{i}/{other}", -learner_reward, member=other, learner_seat=seat),
            keyed(build, f"{i}/judge", 0.0, member="judge", learner_seat=seat),
        ]

    traces = rollout(0, 1.0) + rollout(1, -1.0) + rollout(2, 0.0) + rollout(3, 1.0, seat="debater_b")
    group = members_group(build, traces, trained=("debater_a", "debater_b"), learner_seat_only=True)
    group.task = TaskRef(env="debate", split="eval", idx=0)
    rows = result_rows([group])
    assert [r["learner_seat"] for r in rows[:3]] == ["debater_a"] * 3
    assert [r["trained"] for r in rows] == [True, False, False] * 3 + [True, False, False]
    summary = summarize(rows, k=1, solved_threshold=1.0, failed_groups=0)
    assert summary["win_rate"] == pytest.approx(2 / 4)  # a draw is not a win
    assert summary["eval_reward"] == pytest.approx((1.0 - 1.0 + 0.0 + 1.0) / 4)
    single = result_rows([build.group([build.trace("s", 1.0)])])
    assert "win_rate" not in summarize(single, k=1, solved_threshold=1.0, failed_groups=0)


def test_json_outputs_keep_int_and_str_example_ids(build):
    traces = [keyed(build, "i", 1.0, example=7), keyed(build, "s", 1.0, example="7")]
    rows = json.loads(json.dumps(result_rows([members_group(build, traces)])))
    assert [r["example_id"] for r in rows] == [7, "7"]
    saved = [json.loads(json.dumps(trace_row(t))) for t in traces]
    assert [r["task"]["exampleId"] for r in saved] == [7, "7"]
    assert saved[0]["memberId"] == "debater_a" and saved[0]["id"] == "i"
