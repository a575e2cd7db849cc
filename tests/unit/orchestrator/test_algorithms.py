"""Every builtin algorithm against hand-computed advantages, channels and masks."""

from __future__ import annotations

import math

import pytest

from rlrun.common.config import ConfigError
from rlrun.common.wire import WireError
from rlrun.common.wire.trace import Channel
from rlrun.orchestrator.credit.algorithms import (
    AlgorithmDeps,
    BranchResult,
    apply_branch_results,
    builtin,
    builtin_names,
)
from rlrun.orchestrator.credit.algorithms.grpo import group_advantages
from rlrun.orchestrator.credit.algorithms.max_rl import max_rl_advantages


def run(name, group, args=None, deps=None):
    import asyncio

    algorithm = builtin(name)(args or {}, deps or AlgorithmDeps())
    asyncio.run(algorithm.apply(group))
    return algorithm


def rl_values(trace, branch=0):
    [channel] = [c for c in trace.branches[branch].channels if c.loss == "rl"]
    return channel.values


def test_registry_lists_every_builtin_and_who_handles_members():
    assert builtin_names() == ["echo", "ema_per_member", "grpo", "max_rl", "opd", "opsd", "rl", "sft"]
    assert {n: builtin(n).handles_members for n in builtin_names()} == {
        "echo": False,
        "ema_per_member": True,
        "grpo": False,
        "max_rl": False,
        "opd": True,
        "opsd": True,
        "rl": False,
        "sft": True,
    }


def test_grpo_subtracts_the_group_mean(build):
    traces = [build.trace(f"t{i}", r) for i, r in enumerate([1.0, 0.0, 0.5, 0.5])]
    run("grpo", build.group(traces))
    assert [rl_values(t) for t in traces] == [
        [0, 0, 0, 0.5, 0.5, 0.5],
        [0, 0, 0, -0.5, -0.5, -0.5],
        [0.0] * 6,
        [0.0] * 6,
    ]
    assert all(t.branches[0].mask == [False, False, False, True, True, True] for t in traces)


def test_grpo_std_normalize_divides_by_the_population_std(build):
    traces = [build.trace(f"t{i}", r) for i, r in enumerate([1.0, 0.0, 0.5, 0.5])]
    run("grpo", build.group(traces), {"std_normalize": True, "eps": 0.0})
    std = math.sqrt(0.125)
    assert rl_values(traces[0])[3:] == pytest.approx([0.5 / std] * 3)
    assert rl_values(traces[1])[3:] == pytest.approx([-0.5 / std] * 3)
    assert group_advantages([2.0, 2.0], True, 1e-6) == [0.0, 0.0]  # equal rewards: no signal, no NaN


def test_grpo_rejects_unknown_args():
    with pytest.raises(ConfigError, match=r"orchestrator\.algorithm_args\.grpo.*std_normalise"):
        builtin("grpo")({"std_normalise": True}, AlgorithmDeps())


def test_max_rl_divides_by_a_positive_mean_else_zero(build):
    assert max_rl_advantages([1.0, 0.0, 0.0, 1.0]) == [1.0, -1.0, -1.0, 1.0]
    assert max_rl_advantages([0.2, 0.6]) == pytest.approx([-0.5, 0.5])
    assert max_rl_advantages([0.0, 0.0]) == [0.0, 0.0]
    assert max_rl_advantages([-1.0, 0.0]) == [0.0, 0.0]
    traces = [build.trace("a", 0.2), build.trace("b", 0.6)]
    run("max_rl", build.group(traces))
    assert rl_values(traces[0]) == pytest.approx([0, 0, 0, -0.5, -0.5, -0.5])


def test_rl_uses_the_raw_reward(build):
    traces = [build.trace("a", 0.25), build.trace("b", -1.0)]
    run("rl", build.group(traces))
    assert rl_values(traces[0]) == [0, 0, 0, 0.25, 0.25, 0.25]
    assert rl_values(traces[1]) == [0, 0, 0, -1.0, -1.0, -1.0]


def test_sft_weights_the_actors_tokens_in_the_ce_channel(build):
    t = build.trace("a", 0.0)
    run("sft", build.group([t]), {"weight": 2.0})
    assert [(c.loss, c.values) for c in t.branches[0].channels] == [("ce", [0, 0, 0, 2.0, 2.0, 2.0])]
    assert t.branches[0].mask == [False, False, False, True, True, True]


def test_echo_adds_ce_on_observation_tokens(build):
    good, bad = build.multi_turn("good", 1.0), build.multi_turn("bad", 0.0)
    run("echo", build.group([good, bad]), {"observation_weight": 0.5})
    channels = {c.loss: c.values for c in good.branches[0].channels}
    assert channels["rl"] == [0, 0, 0.5, 0.5, 0, 0, 0, 0.5, 0.5]
    assert channels["ce"] == [0, 0, 0, 0, 0.5, 0.5, 0.5, 0, 0]
    assert good.branches[0].mask == [False, False, True, True, True, True, True, True, True]
    assert {c.loss: c.values for c in bad.branches[0].channels}["rl"] == [
        0,
        0,
        -0.5,
        -0.5,
        0,
        0,
        0,
        -0.5,
        -0.5,
    ]


def test_algorithms_only_credit_trained_members(build):
    learner, judge = build.trace("l", 1.0, member="a"), build.trace("j", 0.0, member="judge")
    run("sft", build.group([learner, judge], trained={"a"}))
    assert learner.branches[0].channels and not judge.branches[0].channels


def test_two_algorithms_append_channels_and_union_masks(build):
    t = build.multi_turn("a", 1.0)
    g = build.group([t, build.multi_turn("b", 0.0)])
    run("grpo", g)
    run("echo", g)
    assert [c.loss for c in t.branches[0].channels] == ["rl", "rl", "ce"]
    assert t.branches[0].mask == [False, False, True, True, True, True, True, True, True]


class FakeScorer:
    def __init__(self, reference):
        self.reference = reference
        self.calls = []

    async def score(self, token_ids, start, temperature):
        self.calls.append((list(token_ids), start, temperature))
        return list(self.reference)


def test_opd_advantage_is_reference_minus_sampling_logprob(build):
    scorer = FakeScorer([-0.2, -1.5, -2.0])
    opened = []
    deps = AlgorithmDeps(
        scorer=lambda key, cap: opened.append((key, cap)) or scorer, model_concurrency=lambda key: 7
    )
    t = build.trace("a", 0.0, logprobs=[-0.5, -1.0, -2.0])
    run("opd", build.group([t], temperatures={"policy": 0.7}), {"coef": 2.0}, deps)
    assert opened == [("reference", 7)]
    assert scorer.calls == [([3, 10, 11, 20, 21, 1], 3, 0.7)]
    assert rl_values(t) == pytest.approx([0, 0, 0, 0.6, -1.0, 0.0])
    assert t.branches[0].mask == [False, False, False, True, True, True]


def test_opd_rejects_a_reference_answer_of_the_wrong_length(build):
    deps = AlgorithmDeps(scorer=lambda key, cap: FakeScorer([-0.1]), model_concurrency=lambda key: 32)
    with pytest.raises(ValueError, match="1 logprobs for 3 scored tokens"):
        run("opd", build.group([build.trace("a")]), {}, deps)


def test_opsd_scores_behind_a_rendered_hint(build):
    scorer = FakeScorer([-0.1, -0.1, -0.1])
    rendered = []

    def render(role, text):
        rendered.append((role, text))
        return [2, 50, 51, 1]

    deps = AlgorithmDeps(scorer=lambda key, cap: scorer, render_message=render)
    t = build.trace("a", 0.0, logprobs=[-0.5, -0.1, -1.1], data='{"answer": "cba"}')
    run("opsd", build.group([t]), {}, deps)
    assert rendered == [("system", "Reference answer: cba")]
    assert scorer.calls == [([2, 50, 51, 1, 3, 10, 11, 20, 21, 1], 7, 1.0)]
    assert rl_values(t) == pytest.approx([0, 0, 0, 0.4, 0.0, 1.0])


def test_opsd_without_a_demonstration_fails_naming_the_key(build):
    deps = AlgorithmDeps(scorer=lambda key, cap: FakeScorer([]), render_message=lambda r, t: [2])
    with pytest.raises(ValueError, match="no demonstration under 'solution'"):
        run("opsd", build.group([build.trace("a", data='{"answer": "x"}')]), {"hint_key": "solution"}, deps)


def test_env_owned_results_are_validated_then_applied(build):
    t = build.trace("a")
    ok = BranchResult("a", 0, [Channel("rl", [0, 0, 0, 1, 1, 1])], [False, False, False, True, True, True])
    apply_branch_results([t], [ok])
    assert t.branches[0].channels[0].values == [0, 0, 0, 1, 1, 1]

    cases = [
        (BranchResult("zzz", 0, [], [True] * 6), r"results\[0\]\.trace_id"),
        (BranchResult("a", 3, [], [True] * 6), r"results\[0\]\.branch_index"),
        (BranchResult("a", 0, [], [True] * 5), r"results\[0\]\.mask has 5 entries but the branch has 6"),
        (
            BranchResult("a", 0, [Channel("ce", [1.0] * 7)], [True] * 6),
            r"results\[0\]\.channels\[0\]\.values",
        ),
        (
            BranchResult("a", 0, [Channel("rl", [math.nan] * 6)], [True] * 6),
            r"results\[0\]\.channels\[0\]\.values\[0\]",
        ),
        (BranchResult("a", 0, [Channel("rl", [0.0] * 6)], []), r"results\[0\]\.mask is empty"),
    ]
    for result, field in cases:
        fresh = build.trace("a")
        with pytest.raises(WireError, match=field):
            apply_branch_results([fresh], [result])
        assert not fresh.branches[0].channels  # nothing is applied from a batch of results with a bad one
