"""Filters on crafted traces, enforce vs monitor, and the batch they leave."""

from __future__ import annotations

import logging
import math

import pytest

from rlrun.common.config import FiltersConfig
from rlrun.common.wire.trace import RewardComponent
from rlrun.orchestrator.credit.algorithms.base import credit_sampled
from rlrun.orchestrator.credit.batching import build_batch
from rlrun.orchestrator.credit.filters import RolloutFilters, has_repetition, is_gibberish

VOCAB = 128
FLOOR = -math.log(VOCAB) - 2.0  # the gibberish threshold with the default offset


def test_gibberish_needs_a_rare_token_far_below_uniform(build):
    assert is_gibberish(
        build.trace("a", completion=(90, 21, 1), logprobs=[FLOOR - 0.1, -0.1, -0.1]), VOCAB, 50, 2.0
    )
    assert not is_gibberish(
        build.trace("a", completion=(90, 21, 1), logprobs=[FLOOR + 0.1, -0.1, -0.1]), VOCAB, 50, 2.0
    )
    assert not is_gibberish(
        build.trace("a", completion=(40, 21, 1), logprobs=[FLOOR - 5, -0.1, -0.1]), VOCAB, 50, 2.0
    )
    # the prompt's tokens were not sampled: their ids do not count
    assert not is_gibberish(
        build.trace("a", prompt=(99, 99), completion=(20,), logprobs=[FLOOR - 1]), VOCAB, 50, 2.0
    )


def test_repetition_needs_a_window_of_consecutive_near_certain_tokens(build):
    looping = build.trace("a", completion=(20,) * 6, logprobs=[-0.001] * 5 + [-3.0])
    assert has_repetition(looping, window=5, logprob_above=-0.01)
    assert not has_repetition(looping, window=6, logprob_above=-0.01)
    broken = build.trace("a", completion=(20,) * 6, logprobs=[-0.001, -0.001, -2.0, -0.001, -0.001, -0.001])
    assert not has_repetition(broken, window=4, logprob_above=-0.01)


def filters(gibberish_enforce=True, repetition_enforce=True):
    cfg = FiltersConfig.model_validate(
        {
            "gibberish": {"enabled": True, "enforce": gibberish_enforce, "token_id_above": 50},
            "repetition": {"enabled": True, "enforce": repetition_enforce, "window": 3},
        }
    )
    return RolloutFilters(cfg, VOCAB)


def crafted_group(build):
    traces = [
        build.trace("clean", 1.0, completion=(20, 21, 1), logprobs=[-0.5, -0.6, -0.7]),
        build.trace("gibberish", 0.0, completion=(90, 21, 1), logprobs=[FLOOR - 1, -0.6, -0.7]),
        build.trace("loop", 0.5, completion=(20, 20, 20), logprobs=[-0.001] * 3),
        build.trace("clean2", 0.5, completion=(22, 21, 1), logprobs=[-0.5, -0.6, -0.7]),
    ]
    for t in traces:
        credit_sampled(t, "rl", t.reward)
    return build.group(traces, temperatures={"policy": 0.8})


def test_enforced_filters_keep_flagged_rollouts_out_of_training_but_in_metrics(build):
    batch = build_batch([crafted_group(build)], filters())
    assert len(batch.samples) == 2
    assert batch.samples[0].temperatures == [0.8] * 6
    m = batch.metrics
    assert (m["rollouts"], m["samples"], m["trained_fraction"], m["filtered_ratio"]) == (4, 2, 0.5, 0.5)
    assert m["reward_mean"] == pytest.approx(0.5)  # filtered rollouts still count in the reward
    assert (m["filter/gibberish_ratio"], m["filter/repetition_ratio"]) == (0.25, 0.25)
    assert (m["env/rev/reward_mean"], m["env/rev/filtered_ratio"]) == (pytest.approx(0.5), 0.5)
    assert batch.flagged == {("gibberish", "rev"): 1, ("repetition", "rev"): 1}


def test_monitoring_filters_only_count(build):
    batch = build_batch([crafted_group(build)], filters(gibberish_enforce=False, repetition_enforce=False))
    assert len(batch.samples) == 4
    assert batch.metrics["filtered_ratio"] == 0.0
    assert batch.metrics["filter/gibberish_ratio"] == 0.25


def test_a_batch_where_everything_is_filtered_is_empty(build):
    traces = [build.trace(f"l{i}", 0.0, completion=(20, 20, 20), logprobs=[-0.001] * 3) for i in range(3)]
    for t in traces:
        credit_sampled(t, "rl", 0.0)
    batch = build_batch([build.group(traces)], filters())
    assert batch.samples == [] and batch.trained_fraction == 0.0 and batch.metrics["filtered_ratio"] == 1.0


def test_a_token_outside_the_vocabulary_keeps_only_its_trace_out_of_training(build, caplog):
    """Always on, whatever the configured filters: the trainer never sees the id, the rest of
    the group trains, and the log names the env, the group and the field."""
    edge = build.multi_turn("edge", 1.0)
    edge.nodes[2].token_ids[1] = VOCAB - 1  # the last id of the vocabulary is fine
    bad = build.multi_turn("bad", 0.0)
    bad.nodes[2].token_ids[1] = VOCAB  # a tool observation from an env that tokenized differently
    for t in (edge, bad):
        credit_sampled(t, "rl", t.reward - 0.5)
    with caplog.at_level(logging.WARNING, logger="rlrun.orchestrator.credit.batching"):
        batch = build_batch([build.group([edge, bad])], RolloutFilters(FiltersConfig(), VOCAB))
    [sample] = batch.samples
    assert max(sample.token_ids) == VOCAB - 1
    assert batch.flagged == {("out_of_vocabulary", "rev"): 1}
    m = batch.metrics
    assert (m["rollouts"], m["filtered_ratio"], m["filter/out_of_vocabulary_ratio"]) == (2, 0.5, 0.5)
    assert m["reward_mean"] == 0.5  # the dropped trace's reward still counts
    [record] = caplog.records
    assert record.getMessage() == (
        "env rev, group g: trace bad never trains (out_of_vocabulary): nodes[2].token_ids[1] = 128 "
        "is outside the model's vocabulary (vocab_size 128)"
    )


def test_an_in_vocabulary_batch_reports_only_the_configured_filters(build):
    traces = [build.trace("a", 1.0), build.trace("b", 0.0)]
    for t in traces:
        credit_sampled(t, "rl", t.reward)
    batch = build_batch([build.group(traces)], filters())
    assert batch.flagged == {} and len(batch.samples) == 2
    assert sorted(k for k in batch.metrics if k.startswith("filter/")) == [
        "filter/gibberish_ratio",
        "filter/repetition_ratio",
    ]


def test_batch_metrics_cover_advantages_tokens_and_reward_components(build):
    traces = [build.trace("a", 1.0), build.trace("b", 0.0)]
    traces[0].rewards = {"similarity": RewardComponent(0.9)}
    traces[1].rewards = {"similarity": RewardComponent(0.1)}
    for t, a in zip(traces, [0.5, -0.5], strict=True):
        credit_sampled(t, "rl", a)
    m = build_batch([build.group(traces)], RolloutFilters(FiltersConfig(), VOCAB)).metrics
    assert (m["tokens"], m["trained_tokens"], m["samples"]) == (6, 6, 2)
    assert (m["advantage_mean"], m["advantage_min"], m["advantage_max"]) == (0.0, -0.5, 0.5)
    assert m["reward/similarity"] == pytest.approx(0.5)
    assert m["reward_std"] == pytest.approx(0.5)
