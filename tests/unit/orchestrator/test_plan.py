"""Plan compilation for single- and multi-agent configs."""

from __future__ import annotations

import pytest

from rlrun.common.config import ConfigError, resolve_config
from rlrun.common.wire.plan import ModelEndpoint
from rlrun.orchestrator.run.plan import (
    check_env_temperature,
    compile_plan,
    compile_plans,
    member_temperatures,
    samples_live_policy,
    sampling_params,
    trained_members,
)


def config(**orchestrator):
    raw = {
        "inference": {"addresses": ["127.0.0.1:1001", "127.0.0.1:1002"]},
        "orchestrator": {
            "train": {
                "sampling": {"temperature": 0.9, "max_completion_tokens": 12},
                "env": [{"id": "reverse-text", "sampling": {"temperature": 0.7}}, {"id": "arithmetic"}],
            },
            **orchestrator,
        },
    }
    return resolve_config(raw)[0]


def test_single_agent_config_is_a_one_target_policy_plan():
    cfg = config()
    plans = compile_plans(cfg)
    assert set(plans.train) == {"reverse-text", "arithmetic"}
    plan = plans.train["reverse-text"]
    assert list(plan.targets) == ["policy"]
    target = plan.targets["policy"]
    assert target.role == "train"
    assert target.model == ModelEndpoint("policy", "inference", ["127.0.0.1:1001", "127.0.0.1:1002"])
    assert (target.sampling.temperature, target.sampling.max_tokens) == (0.7, 12)  # the env's override
    assert plans.train["arithmetic"].targets["policy"].sampling.temperature == 0.9
    assert not plan.is_multi_agent and trained_members(plan) == {"policy"} and samples_live_policy(plan)
    assert plans.warmup == {} and plans.dev == {}


def test_eval_plan_is_greedy_on_the_live_policy():
    plans = compile_plans(config(eval={"greedy": True, "sampling": {"max_completion_tokens": 8}}))
    target = plans.eval["reverse-text"].targets["policy"]
    assert (target.sampling.temperature, target.sampling.max_tokens, target.model.name) == (0.0, 8, "policy")
    sampled = (
        compile_plans(config(eval={"greedy": False, "pass_k": 4})).eval["reverse-text"].targets["policy"]
    )
    assert sampled.sampling.temperature == 0.7


def test_warm_start_plays_the_oracle_as_a_fixed_rule_target():
    plans = compile_plans(config(warm_start={"max_steps": 5}, eval={"greedy": False}))
    target = plans.warmup["reverse-text"].targets["policy"]
    assert target.model == ModelEndpoint("oracle", "rule", [])
    assert target.role == "fixed"
    assert trained_members(plans.warmup["reverse-text"]) == {"policy"}  # the policy learns from the oracle
    assert not samples_live_policy(plans.warmup["reverse-text"])
    assert member_temperatures(plans.warmup["reverse-text"]) == {"policy": 1.0}
    dev = plans.dev["reverse-text"].targets["policy"]
    assert (dev.model.name, dev.sampling.temperature) == ("policy", 0.0)  # the dev check is always greedy


def test_actor_selects_a_named_model_target():
    cfg = config(actor="teacher", models={"teacher": {"addresses": ["127.0.0.1:2000"], "max_concurrency": 4}})
    target = compile_plans(cfg).train["reverse-text"].targets["policy"]
    assert target.model == ModelEndpoint("teacher", "inference", ["127.0.0.1:2000"])
    assert target.role == "fixed"
    assert not samples_live_policy(compile_plans(cfg).train["reverse-text"])


def test_multi_agent_config_is_keyed_by_member_with_roles_and_targets():
    cfg = config(
        models={"opponent": {"addresses": ["127.0.0.1:3000"]}, "judge": {"kind": "rule"}},
        members=[
            {"id": "debater_a", "role": "train"},
            {"id": "debater_b", "role": "fixed", "model": "opponent"},
            {"id": "judge", "role": "fixed", "model": "judge"},
        ],
    )
    plan = compile_plans(cfg).train["reverse-text"]
    assert plan.is_multi_agent
    assert {k: (t.member_id, t.role, t.model) for k, t in plan.targets.items()} == {
        "debater_a": (
            "debater_a",
            "train",
            ModelEndpoint("policy", "inference", ["127.0.0.1:1001", "127.0.0.1:1002"]),
        ),
        "debater_b": ("debater_b", "fixed", ModelEndpoint("opponent", "inference", ["127.0.0.1:3000"])),
        "judge": ("judge", "fixed", ModelEndpoint("judge", "rule", [])),
    }
    assert trained_members(plan) == {"debater_a"}
    assert samples_live_policy(plan)
    assert member_temperatures(plan) == {
        "debater_a": 0.7,
        "debater_b": 0.7,
        "judge": 1.0,
    }


def test_missing_replicas_fail_naming_the_key():
    cfg = config()
    cfg.inference.addresses = []
    with pytest.raises(ConfigError, match=r"inference\.addresses"):
        compile_plans(cfg)
    cfg = config(actor="teacher", models={"teacher": {}})
    with pytest.raises(ConfigError, match=r"orchestrator\.models\.teacher\.addresses"):
        compile_plans(cfg)


def test_the_configured_temperature_trains_and_is_never_fanned_out_as_zero():
    cfg = config()
    greedy = compile_plan(
        cfg, actor="policy", sampling=sampling_params(cfg.orchestrator.train.sampling, greedy=True)
    )
    assert member_temperatures(greedy) == {"policy": 1.0}
    assert member_temperatures(compile_plans(cfg).train["reverse-text"]) == {"policy": 0.7}


def test_an_env_declaring_another_temperature_is_refused_when_it_would_skew_the_ratio(caplog):
    cfg = config()
    check_env_temperature(cfg, 0, 0.0)  # not declared
    check_env_temperature(cfg, 0, 0.7)  # the entry's own override
    with pytest.raises(ConfigError) as refused:
        check_env_temperature(cfg, 1, 0.7)  # arithmetic samples at the run's 0.9
    assert refused.value.path == "orchestrator.train.env.1"
    assert "declares temperature 0.7" in str(refused.value) and "importance ratio" in str(refused.value)
    # A rule-played actor samples nothing from logits: nothing trains at the temperature.
    rule = config(actor="scripted", models={"scripted": {"kind": "rule"}})
    with caplog.at_level("WARNING", logger="rlrun.orchestrator.run.plan"):
        check_env_temperature(rule, 1, 0.7)
    [warning] = caplog.records
    assert "env 'arithmetic' declares temperature 0.7" in warning.getMessage()
