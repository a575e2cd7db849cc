"""Built-in environments: scorers on hand-made cases, reference answers, tasks, registry."""

from __future__ import annotations

import pytest

from rlrun.common.wire.inference import Completion
from rlrun.common.wire.trace import RewardComponent
from rlrun.env_server.envs.alphabet_sort import AlphabetSort
from rlrun.env_server.envs.arithmetic import Arithmetic
from rlrun.env_server.envs.registry import BUILTIN, make_env, resolve
from rlrun.env_server.envs.reverse_text import ReverseText
from rlrun.env_server.envs.tool_calc import ToolCalc, calculate
from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.episode import POLICY, Episode
from rlrun.env_server.sdk.errors import ToolError
from rlrun.env_server.sdk.harnesses import MultiTurnHarness, SingleTurnHarness, ToolCallingHarness
from rlrun.env_server.sdk.task import Task


def answered(tokenizer, task: Task, *answers: str, turns: int | None = None) -> Episode:
    """An episode in which the model gave `answers`, in order."""
    conversation = Conversation(tokenizer)
    conversation.add_prompt(task.prompt)
    for answer in answers:
        tokens = tokenizer.encode(answer) + [tokenizer.eos_token_id]
        conversation.add_completion(Completion(tokens, [0.0] * len(tokens), "stop"))
    episode = Episode(task, {POLICY: conversation}, {})
    if turns is not None:
        episode.metrics["turns"] = turns
    return episode


def task(prompt: str, answer: str, **data) -> Task:
    return Task("train", 0, prompt, prompt, {"answer": answer, **data})


@pytest.mark.parametrize(
    ("answer", "reward"), [("cba", 1.0), ("", 0.0), ("cb", 1 - 1 / 3), ("abc", 1 - 2 / 3), ("cbaa", 0.75)]
)
def test_reverse_text_scores_one_minus_normalised_edit_distance(tokenizer, answer, reward):
    score = ReverseText().score(task("abc", "cba"), answered(tokenizer, task("abc", "cba"), answer))
    assert score.reward == pytest.approx(reward)
    assert list(score.rewards) == ["similarity"]


def test_reverse_text_tasks_are_short_letter_prompts_with_their_reverse():
    env = ReverseText(min_len=3, max_len=8)
    assert isinstance(env.harness, SingleTurnHarness)
    assert env.taskset.sizes == {"train": 1_000_000, "eval": 256}
    for split, idx in [("train", 0), ("train", 77), ("eval", 0), ("eval", 255)]:
        t = env.taskset.get(split, idx)
        assert t.prompt.isalpha() and t.prompt.islower() and 3 <= len(t.prompt) <= 8
        assert env.reference_answer(t) == t.prompt[::-1] == t.data["answer"]
    with pytest.raises(ValueError):
        ReverseText(min_len=5, max_len=4)


def test_alphabet_sort_single_turn(tokenizer):
    env = AlphabetSort()
    assert isinstance(env.harness, SingleTurnHarness)
    t = env.taskset.get("train", 5)
    assert env.reference_answer(t) == "".join(sorted(t.prompt))
    score = env.score(task("dcba", "abcd"), answered(tokenizer, task("dcba", "abcd"), "abdc"))
    assert score.rewards == {"similarity": RewardComponent(0.5, 1.0)}


def test_alphabet_sort_multi_turn_feedback_and_turn_penalty(tokenizer):
    env = AlphabetSort(max_turns=3, turn_penalty=0.1)
    assert isinstance(env.harness, MultiTurnHarness) and not env.harness.rewrite_history
    t = task("dcba", "abcd")
    assert env.feedback(t, answered(tokenizer, t, "abdc")) == "2/4"
    assert env.feedback(t, answered(tokenizer, t, "abcd")) is None
    assert env.feedback(t, answered(tokenizer, t, "ab")) == "2/4"
    score = env.score(t, answered(tokenizer, t, "abdc", "abcd", turns=2))
    assert score.reward == pytest.approx(0.9)
    assert score.rewards["extra_turns"] == RewardComponent(1, -0.1)
    rewriting = AlphabetSort(max_turns=3, rewrite_history=True)
    assert rewriting.feedback(t, answered(tokenizer, t, "bacd")) == "bacd 2/4"


@pytest.mark.parametrize(("answer", "correct"), [("46", 1.0), (" 46", 1.0), ("45", 0.0), ("", 0.0)])
def test_arithmetic_is_exact_match(tokenizer, answer, correct):
    t = task("12+34", "46")
    assert Arithmetic().score(t, answered(tokenizer, t, answer)).rewards["correct"].score == correct


def test_arithmetic_answers_are_right():
    env = Arithmetic(ops="+-*")
    for idx in range(50):
        t = env.taskset.get("train", idx)
        a, op, b = _split(t.prompt)
        assert int(t.data["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert env.reference_answer(t) == t.data["answer"]
    with pytest.raises(ValueError):
        Arithmetic(ops="/")


def _split(problem: str) -> tuple[int, str, int]:
    for i, ch in enumerate(problem):
        if ch in "+-*" and i > 0:
            return int(problem[:i]), ch, int(problem[i + 1 :])
    raise AssertionError(problem)


@pytest.mark.parametrize(
    ("expression", "result"),
    [("2+3*4", "14"), ("(2+3)*4", "20"), ("-5*3", "-15"), ("7//2", "3"), ("7%4", "3"), (" 417*38 ", "15846")],
)
def test_the_calculator_evaluates_integer_arithmetic(expression, result):
    assert calculate(expression) == result


@pytest.mark.parametrize(
    "expression",
    [
        "2**8",
        "abc",
        "1//0",
        "1/2",
        "__import__('os')",
        "1" * 65,
        "2.5*2",
        "999999999999*999999999",
        "True+1",
        "",
    ],
)
def test_the_calculator_refuses_anything_else(expression):
    with pytest.raises(ToolError):
        calculate(expression)


def test_tool_calc_scores_the_final_answer(tokenizer):
    env = ToolCalc()
    assert isinstance(env.harness, ToolCallingHarness) and set(env.harness.tools) == {"calc"}
    t = env.taskset.get("train", 1)
    assert env.reference_answer(t) == calculate(t.prompt)
    right = answered(tokenizer, t, f"calc({t.prompt})", t.data["answer"])
    wrong = answered(tokenizer, t, "12")
    assert env.score(t, right).reward == 1.0 and env.score(t, wrong).reward == 0.0


def test_the_registry_knows_every_builtin_and_import_paths():
    generated = {"reverse-text", "alphabet-sort", "arithmetic", "tool-calc", "code-sandbox", "debate"}
    assert set(BUILTIN) == generated | {"dataset"}  # dataset: tests/unit/env_server/test_dataset_env.py
    for env_id in generated:
        assert make_env(env_id, {}).taskset.sizes["eval"] == 256
    assert resolve("rlrun.env_server.envs.arithmetic:Arithmetic") is Arithmetic
    assert len(make_env("reverse-text", {"min_len": 3, "max_len": 3}).taskset.get("train", 0).prompt) == 3


@pytest.mark.parametrize(
    ("env_id", "args", "message"),
    [
        ("nope", {}, "unknown environment"),
        ("revers-text", {}, r"unknown environment 'revers-text' \(did you mean reverse-text\?\)"),
        ("no_such_module:Env", {}, "cannot import no_such_module: .*on PYTHONPATH"),
        (
            "rlrun.env_server.envs.arithmetic:Nothing",
            {},
            "module rlrun.env_server.envs.arithmetic has no 'Nothing'",
        ),
        (
            "rlrun.env_server.envs.arithmetic:Arithmetik",
            {},
            r"has no 'Arithmetik' \(did you mean Arithmetic\?\)",
        ),
        ("rlrun.env_server.sdk.scoring:similarity", {}, "not an Environment"),
        ("reverse-text", {"bogus": 1}, "bad args"),
    ],
)
def test_the_registry_names_what_is_wrong(env_id, args, message):
    with pytest.raises(ValueError, match=message):
        make_env(env_id, args)
