"""Env-owned algorithms: the length-penalised advantage by hand, and result merging."""

from __future__ import annotations

import json

import pytest

from rlrun.common.wire.trace import Branch, Channel, MessageNode, TaskRef, Trace, TraceError
from rlrun.env_server.envs.reverse_text import ReverseText
from rlrun.env_server.sdk.algorithms import BranchResult, run_env_algorithms, sampled_advantage


def trace(trace_id: str, reward: float, sampled: int, answer: str = "abc", failed: bool = False) -> Trace:
    """A user node of 3 prompt tokens and an assistant node: header + `sampled` tokens."""
    nodes = [
        MessageNode("u", "user", [3, 10, 11], [False] * 3),
        MessageNode(
            "a", "assistant", [4] + [20] * sampled, [False] + [True] * sampled, [-0.1] * sampled, parent="u"
        ),
    ]
    return Trace(
        id=trace_id,
        task=TaskRef("reverse-text", "train", 0, "cba", json.dumps({"answer": answer})),
        nodes=nodes,
        branches=[Branch(["u", "a"])],
        reward=reward,
        errors=[TraceError("Timeout", "late", True)] if failed else [],
    )


def test_length_penalty_by_hand():
    # target = len("abc") + 1 = 4 sampled tokens.
    # A: r' = 1.0 - 0.1 * |4 - 4| / 4 = 1.0;  B: r' = 0.5 - 0.1 * |6 - 4| / 4 = 0.45;  C failed: left out.
    # baseline = (1.0 + 0.45) / 2 = 0.725, so A: +0.275 and B: -0.275 on their sampled tokens.
    traces = [trace("A", 1.0, 4), trace("B", 0.5, 6), trace("C", 1.0, 4, failed=True)]
    results = {r.trace_id: r for r in ReverseText(length_penalty=0.1).length_penalty_advantages(traces)}
    assert set(results) == {"A", "B"}
    a, b = results["A"], results["B"]
    assert a.mask == [False] * 4 + [True] * 4 and b.mask == [False] * 4 + [True] * 6
    assert [c.loss for c in a.channels] == ["rl"]
    assert a.channels[0].values == pytest.approx([0.0] * 4 + [0.275] * 4)
    assert b.channels[0].values == pytest.approx([0.0] * 4 + [-0.275] * 6)


def test_length_penalty_of_an_all_failed_group_is_empty():
    assert ReverseText().length_penalty_advantages([trace("A", 0.0, 4, failed=True)]) == []


async def test_results_for_one_branch_merge_channels_and_or_masks():
    t = trace("A", 1.0, 2)
    ce_on_prompt = BranchResult(
        "A", 0, [Channel("ce", [1.0, 1.0, 1.0, 0.0, 0.0, 0.0])], [True] * 3 + [False] * 3
    )
    available = {"rl": lambda traces: [sampled_advantage(t, 0, 2.0)], "ce": lambda traces: [ce_on_prompt]}
    [merged] = await run_env_algorithms(available, ["rl", "ce"], [t])
    assert [c.loss for c in merged.channels] == ["rl", "ce"]
    assert merged.mask == [True, True, True, False, True, True]
    assert merged.channels[0].values == [0.0, 0.0, 0.0, 0.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (BranchResult("nobody", 0, [], []), "does not exist"),
        (BranchResult("A", 1, [], []), "does not exist"),
        (BranchResult("A", 0, [Channel("rl", [0.0] * 5)], []), "bad dimensions"),
        (BranchResult("A", 0, [], [True] * 7), "bad dimensions"),
    ],
)
async def test_an_algorithm_returning_a_bad_result_is_an_env_bug(result, message):
    with pytest.raises(RuntimeError, match=message):
        await run_env_algorithms({"bad": lambda traces: [result]}, ["bad"], [trace("A", 1.0, 2)])
