"""The debate env: seeded questions with known answers, rule judge and opponent, winner-take-all
zero-sum rewards, and the learner's seat in every trace."""

from __future__ import annotations

import asyncio

import pytest

from rlrun.common.wire.inference import Completion
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint, PlanTarget
from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.envs.debate import DRAW, Debate, outcome_rewards, verdict
from rlrun.env_server.sdk.taskset import in_eval_bucket
from rlrun.env_server.server.rollout import RolloutJob, Runtime, run_rollouts

MEMBERS = ("debater_a", "debater_b", "judge")


class ScriptedClient:
    """Duck-types InferenceClient.generate: `answer(prompt text)` per call, records the prompts."""

    def __init__(self, tokenizer, answer):
        self.tokenizer = tokenizer
        self.answer = answer
        self.prompts: list[str] = []

    async def generate(self, addresses, prompt_ids, sampling, request_id=""):
        prompt = self.tokenizer.decode(prompt_ids)
        self.prompts.append(prompt)
        tokens = self.tokenizer.encode(self.answer(prompt)) + [self.tokenizer.eos_token_id]
        return [Completion(tokens, [-0.5] * len(tokens), "stop", 1, 1)] * sampling.n


def plan(**kinds) -> GenerationPlan:
    """debater_a trains (the policy, or the oracle when a rule); debater_b and the judge are fixed."""
    sampling = SamplingParams(max_tokens=8)
    roles = {"debater_a": "train", "debater_b": "fixed", "judge": "fixed"}
    targets = {}
    for member in MEMBERS:
        kind = kinds.get(member, "rule")
        endpoint = ModelEndpoint(member, kind, ["i:1"] if kind == "inference" else [])
        targets[member] = PlanTarget(member, roles[member], endpoint, sampling)
    return GenerationPlan(targets)


async def debate(env, tokenizer, the_plan, split="eval", idx=0, n=1, client=None):
    task = env.taskset.get(split, idx)
    job = RolloutJob("debate", task, the_plan, "g", [f"g/{i}" for i in range(n)])
    traces = await run_rollouts(env, job, Runtime(tokenizer, client, 48), 10.0, asyncio.Event())
    return task, traces


def test_questions_are_seeded_with_known_answers_and_a_disjoint_eval_split():
    env = Debate(seed=3)
    for idx in range(20):
        task = env.taskset.get("train", idx)
        a, b = task.data["numbers"]
        assert task.prompt == f"max({a},{b})" and a != b and min(a, b) >= 10 and max(a, b) <= 99
        assert task.data["answer"] == str(max(a, b)) == env.reference_answer(task)
        assert not in_eval_bucket(task.example_id, 16)
    assert env.taskset.get("train", 7) == Debate(seed=3).taskset.get("train", 7)
    assert all(in_eval_bucket(env.taskset.get("eval", i).example_id, 16) for i in range(256))


@pytest.mark.parametrize(
    ("a", "b", "judged"),
    [("52", "37", "a"), ("37", "52", "b"), ("52", "52", DRAW), ("37", "37", DRAW), ("", "x", DRAW)],
)
def test_the_rule_judge_rules_for_the_only_correct_debater(a, b, judged):
    assert verdict({"debater_a": a, "debater_b": b}, "52") == judged


def test_rewards_are_winner_take_all_and_zero_sum():
    assert outcome_rewards("a") == {"debater_a": 1.0, "debater_b": -1.0}
    assert outcome_rewards("b") == {"debater_a": -1.0, "debater_b": 1.0}
    assert outcome_rewards(DRAW) == outcome_rewards("nonsense") == {"debater_a": 0.0, "debater_b": 0.0}


async def test_the_oracle_learner_beats_the_rule_opponent_whenever_it_errs(tokenizer):
    env = Debate(opponent_accuracy=0.5)
    outcomes = []
    for idx in range(40):
        task, traces = await debate(env, tokenizer, plan(), idx=idx)
        by_member = {t.member_id: t for t in traces}
        assert list(by_member) == list(MEMBERS)
        assert all(t.info == {"learner_seat": "debater_a"} and not t.errors for t in traces)
        learner, opponent, judge = (by_member[m] for m in MEMBERS)
        assert learner.reward + opponent.reward == 0.0 and judge.reward == 0.0
        assert learner.metrics["correct"] == 1.0 and judge.metrics["valid_verdict"] == 1.0
        outcomes.append(learner.reward)
        if opponent.metrics["correct"]:
            assert learner.reward == 0.0  # both right: a draw
        else:
            assert learner.reward == 1.0
            assert [n.content for n in opponent.nodes if n.role == "assistant"] == [
                str(min(task.data["numbers"]))
            ]
    assert 10 <= outcomes.count(1.0) <= 30  # the opponent is right about half the time
    _, again = await debate(env, tokenizer, plan(), idx=3)
    _, first = await debate(env, tokenizer, plan(), idx=3)
    assert [t.reward for t in again] == [t.reward for t in first]  # every eval faces the same opponent


async def test_the_judge_sees_both_public_answers_and_the_debaters_never_see_the_verdict(tokenizer):
    client = ScriptedClient(
        tokenizer, lambda prompt: "b" if prompt.startswith("judge") else "<think>hm</think>11"
    )
    env = Debate(rounds=2, opponent_accuracy=1.0)
    task, traces = await debate(env, tokenizer, plan(debater_a="inference", judge="inference"), client=client)
    answer = task.data["answer"]
    learner_prompts = [p for p in client.prompts if not p.startswith("judge")]
    [judge_prompt] = [p for p in client.prompts if p.startswith("judge")]
    # Round 1 is simultaneous: the learner's first prompt is the bare question.
    assert learner_prompts[0] == task.prompt
    # Round 2 is sequential: the learner has seen b's answer, never anyone's thinking.
    assert learner_prompts[1] == f"{task.prompt}<think>hm</think>11b: {answer}"
    assert judge_prompt == f"judge {task.prompt}a: 11b: {answer}a: 11b: {answer}"
    by_member = {t.member_id: t for t in traces}
    assert [by_member[m].reward for m in MEMBERS] == [-1.0, 1.0, 0.0]  # the model judge said b
    observed = {m: [n.content for n in by_member[m].nodes if n.is_observation] for m in MEMBERS}
    assert observed == {
        "debater_a": [f"b: {answer}"],
        "debater_b": ["a: 11", "a: 11"],
        "judge": ["a: 11", f"b: {answer}", "a: 11", f"b: {answer}"],
    }


async def test_an_invalid_verdict_is_a_draw(tokenizer):
    client = ScriptedClient(tokenizer, lambda prompt: "maybe")
    env = Debate(opponent_accuracy=0.0)
    _, traces = await debate(env, tokenizer, plan(judge="inference"), client=client)
    by_member = {t.member_id: t for t in traces}
    assert [by_member[m].reward for m in MEMBERS] == [0.0, 0.0, 0.0]
    assert by_member["judge"].metrics["valid_verdict"] == 0.0
