"""Resolving each env's algorithm ids: builtin, env-owned, unknown, and member support."""

from __future__ import annotations

import pytest

from rlrun.common.config import ConfigError
from rlrun.common.wire.trace import Channel
from rlrun.orchestrator.credit.algorithms import AlgorithmDeps, BranchResult, EnvOwnedAlgorithms
from rlrun.orchestrator.credit.pipeline import CreditPipelines, EnvAlgorithmSpec


async def no_env_algorithms(env_id, ids, traces):
    raise AssertionError("RunAlgorithms must not be called")


def spec(ids, owned=(), members=(), env="rev"):
    return EnvAlgorithmSpec(
        env=env, env_id=f"{env}-id", ids=list(ids), owned=list(owned), members=list(members)
    )


def test_unknown_id_names_the_id_and_the_env():
    with pytest.raises(
        ConfigError,
        match=r"algorithm 'mystery' for env 'rev' is neither builtin .* \(it offers: judge_credit\)",
    ):
        CreditPipelines(
            [spec(["grpo", "mystery"], owned=["judge_credit"])], {}, AlgorithmDeps(), no_env_algorithms
        )


def test_multi_agent_env_with_an_algorithm_that_cannot_handle_members_fails_naming_both():
    with pytest.raises(
        ConfigError, match=r"env 'debate' is multi-agent \(members: a, b, judge\) but algorithm 'grpo'"
    ):
        CreditPipelines(
            [spec(["grpo"], members=["a", "b", "judge"], env="debate")],
            {},
            AlgorithmDeps(),
            no_env_algorithms,
        )
    pipelines = CreditPipelines(
        [spec(["sft"], members=["a", "judge"], env="debate")], {}, AlgorithmDeps(), no_env_algorithms
    )
    assert [a.name for a in pipelines.pipelines["debate"]] == ["sft"]


def test_builtin_instances_are_shared_and_env_owned_runs_are_batched():
    pipelines = CreditPipelines(
        [
            spec(["grpo", "own_a", "own_b", "sft", "own_c"], owned=["own_a", "own_b", "own_c"]),
            spec(["grpo"], env="other"),
        ],
        {"grpo": {"std_normalize": True}},
        AlgorithmDeps(),
        no_env_algorithms,
    )
    rev = pipelines.pipelines["rev"]
    assert [type(a).__name__ for a in rev] == ["Grpo", "EnvOwnedAlgorithms", "Sft", "EnvOwnedAlgorithms"]
    assert rev[1].ids == ["own_a", "own_b"] and rev[3].ids == ["own_c"]
    assert rev[0] is pipelines.pipelines["other"][0]
    assert rev[0].args.std_normalize is True
    assert pipelines.state_dict() == {}


async def test_env_owned_algorithms_go_through_run_algorithms(build):
    calls = []

    async def run_algorithms(env_id, ids, traces):
        calls.append((env_id, ids, [t.id for t in traces]))
        return [
            BranchResult(t.id, 0, [Channel("rl", [0.0, 0.0, 0.0, 2.0, 2.0, 2.0])], [False] * 3 + [True] * 3)
            for t in traces
        ]

    pipelines = CreditPipelines([spec(["grpo", "own"], owned=["own"])], {}, AlgorithmDeps(), run_algorithms)
    group = build.group([build.trace("x", 1.0), build.trace("y", 0.0)])
    await pipelines.apply(group)
    assert calls == [("rev-id", ["own"], ["x", "y"])]
    assert [c.values[3] for c in group.traces[0].branches[0].channels] == [0.5, 2.0]
    assert isinstance(pipelines.pipelines["rev"][1], EnvOwnedAlgorithms)


def test_state_of_an_algorithm_the_run_does_not_use_is_an_error():
    pipelines = CreditPipelines([spec(["grpo"])], {}, AlgorithmDeps(), no_env_algorithms)
    pipelines.load_state_dict({})
    with pytest.raises(ValueError, match="ema_per_member"):
        pipelines.load_state_dict({"ema_per_member": {"baselines": {}}})
