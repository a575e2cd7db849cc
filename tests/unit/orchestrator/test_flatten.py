"""Trace-to-sample flattening: masks, shared nodes, parse errors, temperatures, channels."""

from __future__ import annotations

import pytest

from rlrun.common.wire.trace import Branch, Channel, MessageNode, TaskRef, Trace
from rlrun.orchestrator.credit.algorithms.base import add_credit
from rlrun.orchestrator.credit.flatten import flatten_trace, merge_channels


def credit(trace, branch, loss, values, mask):
    add_credit(trace.branches[branch], loss, values, mask)


def test_one_sample_per_branch_with_logprobs_temperatures_and_channels(build):
    t = build.trace("a", logprobs=[-0.1, -0.2, -0.3])
    credit(t, 0, "rl", [0, 0, 0, 1.0, 1.0, 1.0], [False, False, False, True, True, True])
    [sample] = flatten_trace(t, temperature=0.7)
    assert sample.token_ids == [3, 10, 11, 20, 21, 1]
    assert sample.mask == [False, False, False, True, True, True]
    assert sample.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, -0.3]
    assert sample.temperatures == [0.7] * 6
    assert sample.channels == [Channel("rl", [0, 0, 0, 1.0, 1.0, 1.0])]
    sample.validate()


def test_same_loss_channels_are_summed():
    assert merge_channels(
        [Channel("rl", [1.0, 2.0]), Channel("ce", [0.0, 1.0]), Channel("rl", [0.5, -2.0])]
    ) == [
        Channel("rl", [1.5, 0.0]),
        Channel("ce", [0.0, 1.0]),
    ]


def test_a_shared_node_trains_once(build):
    t = build.branching("b")
    for branch in range(2):
        length = t.branch_length(branch)
        credit(t, branch, "rl", [1.0] * length, [True] * length)
    first, second = flatten_trace(t, 1.0)
    # branch 0 = u(2) a1(2) f1(2) a2(2); branch 1 = u(2) a1(2) f2(2) a3(3)
    assert first.mask == [False, False, True, True, False, False, True, True]
    assert second.token_ids == [3, 10, 20, 21, 3, 41, 23, 24, 1]
    assert second.mask == [False, False, False, False, False, False, True, True, True]


def test_a_branch_without_credit_emits_nothing_and_does_not_claim_shared_nodes(build):
    t = build.branching("b")
    credit(t, 1, "rl", [1.0] * 9, [True] * 9)
    [only] = flatten_trace(t, 1.0)
    assert only.mask == [False, False, True, True, False, False, True, True, True]


def test_parse_error_nodes_never_train(build):
    t = build.trace("a")
    t.nodes[1].parse_error = True
    credit(t, 0, "rl", [1.0] * 6, [True] * 6)
    assert flatten_trace(t, 1.0) == []


def test_unsampled_tokens_train_only_as_ce_weighted_observations(build):
    t = build.multi_turn("m")
    credit(t, 0, "rl", [0.0] * 9, [True] * 9)  # an over-eager mask: prompt tokens cannot train
    [sample] = flatten_trace(t, 1.0)
    assert sample.mask == [False, False, True, True, False, False, False, True, True]
    t = build.multi_turn("m")
    credit(t, 0, "ce", [0, 0, 0, 0, 1.0, 0.0, 1.0, 0, 0], [True] * 9)
    [sample] = flatten_trace(t, 1.0)
    # The rl mask stays on model-sampled tokens; observation tokens train through their CE weight.
    assert sample.mask == [False, False, True, True, False, False, False, True, True]
    assert sample.channels == [Channel("ce", [0, 0, 0, 0, 1.0, 0.0, 1.0, 0, 0])]


def test_ce_weights_are_cleared_where_the_algorithm_mask_is_off(build):
    t = build.multi_turn("m")
    credit(t, 0, "ce", [1.0] * 9, [False] * 4 + [True] * 5)
    [sample] = flatten_trace(t, 1.0)
    assert sample.channels == [Channel("ce", [0.0] * 4 + [1.0] * 5)]


def test_temperature_must_be_positive(build):
    with pytest.raises(ValueError, match="positive"):
        flatten_trace(build.trace("a"), 0.0)


def test_shared_prefix_across_three_branches():
    nodes = [
        MessageNode("r", "user", [3], [False]),
        MessageNode("x", "assistant", [20, 21], [True, True], [-1.0, -1.0], parent="r"),
        MessageNode("y", "assistant", [22], [True], [-1.0], parent="x"),
        MessageNode("z", "assistant", [23], [True], [-1.0], parent="x"),
    ]
    t = Trace(
        id="t",
        task=TaskRef("rev", "train", 0),
        nodes=nodes,
        branches=[Branch(["r", "x", "y"]), Branch(["r", "x", "z"]), Branch(["r", "x"])],
    )
    for b in range(3):
        n = t.branch_length(b)
        credit(t, b, "rl", [1.0] * n, [True] * n)
    masks = [s.mask for s in flatten_trace(t, 1.0)]
    assert masks == [
        [False, True, True, True],
        [False, False, False, True],
    ]  # the third branch has nothing left
