"""The rollout runner: traces out of episodes, and every failure as data."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from rlrun.common.wire.inference import Completion
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint, PlanTarget
from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.envs.reverse_text import ReverseText
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.errors import InvalidModelOutput, ModelCallError
from rlrun.env_server.sdk.harnesses import SingleTurnHarness
from rlrun.env_server.sdk.models import InferenceModel, RuleModel
from rlrun.env_server.sdk.task import Score, Task
from rlrun.env_server.server.rollout import CANCELLED, RolloutJob, Runtime, error_traces, run_rollouts


class FakeClient:
    """Duck-types InferenceClient.generate: answers the reversed prompt, or raises, or hangs."""

    def __init__(
        self, tokenizer, error: Exception | None = None, hang: bool = False, answer: str | None = None
    ):
        self.tokenizer = tokenizer
        self.error = error
        self.hang = hang
        self.answer = answer
        self.calls: list[tuple[list[str], list[int], SamplingParams, str]] = []

    async def generate(self, addresses, prompt_ids, sampling, request_id=""):
        self.calls.append((list(addresses), list(prompt_ids), sampling, request_id))
        if self.hang:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        text = self.answer if self.answer is not None else self.tokenizer.decode(prompt_ids)[::-1]
        tokens = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
        return [Completion(tokens, [-0.5] * len(tokens), "stop", 2, 5) for _ in range(sampling.n)]


def plan(kind: str = "inference", member: str = "policy", max_tokens: int = 12, seed: int | None = None):
    addresses = ["inference-a:1", "inference-b:1"] if kind == "inference" else []
    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)
    return GenerationPlan(
        {member: PlanTarget(member, "train", ModelEndpoint(member, kind, addresses), sampling)}
    )


ENV = ReverseText()


def job(n: int = 4, idx: int = 3, the_plan: GenerationPlan | None = None) -> RolloutJob:
    return RolloutJob(
        "rt", ENV.taskset.get("train", idx), the_plan or plan(), "grp", [f"grp/{i}" for i in range(n)]
    )


async def run(env, tokenizer, client, the_job=None, timeout_s=30.0, cancelled=None, max_model_len=32):
    return await run_rollouts(
        env,
        the_job or job(),
        Runtime(tokenizer, client, max_model_len),
        timeout_s,
        cancelled or asyncio.Event(),
    )


async def test_a_group_becomes_validated_traces_in_order(tokenizer):
    client = FakeClient(tokenizer)
    traces = await run(ENV, tokenizer, client)
    [(addresses, prompt, sampling, _)] = client.calls
    assert sampling.n == 4 and tokenizer.eos_token_id in sampling.stop_token_ids
    assert sampling.max_tokens == min(12, 32 - len(prompt))
    task = ENV.taskset.get("train", 3)
    assert [t.id for t in traces] == [f"grp/{i}" for i in range(4)]
    for trace in traces:
        assert trace.group_id == "grp" and trace.member_id == "policy"
        assert (trace.task.env, trace.task.split, trace.task.idx, trace.task.example_id) == (
            "rt",
            "train",
            3,
            task.example_id,
        )
        assert json.loads(trace.task.data) == task.data
        assert trace.reward == pytest.approx(1.0) and trace.rewards["similarity"].weight == 1.0
        assert trace.policy_span == (2, 5)
        assert trace.stop_condition == "completed" and not trace.errors
        assert trace.metrics["completion_tokens"] == len(task.data["answer"]) + 1
        assert set(trace.timing) == {"setup_s", "generation_s", "scoring_s", "total_s"}


@pytest.mark.parametrize(
    ("error", "kind", "retryable"),
    [
        (ModelCallError("UNAVAILABLE", "down", retryable=True), "ModelCallError", True),
        (ModelCallError("INVALID_ARGUMENT", "bad", retryable=False), "ModelCallError", False),
        (InvalidModelOutput("3 logprobs for 4 tokens"), "InvalidModelOutput", True),
    ],
)
async def test_model_failures_become_error_traces(tokenizer, error, kind, retryable):
    traces = await run(ENV, tokenizer, FakeClient(tokenizer, error=error), job(n=3))
    assert len(traces) == 3
    for trace in traces:
        assert trace.stop_condition == "error" and trace.rewards == {} and trace.reward == 0.0
        [found] = trace.errors
        assert (found.type, found.retryable) == (kind, retryable)
        assert [n.role for n in trace.nodes] == ["user"]


async def test_a_harness_bug_is_not_retryable(tokenizer):
    class Broken(ReverseText):
        def __init__(self):
            super().__init__()

            class Harness(SingleTurnHarness):
                async def run_group(self, episodes):
                    raise TypeError("can only concatenate str")

            self.harness = Harness()

    [trace] = await run(Broken(), tokenizer, FakeClient(tokenizer), job(n=1))
    [error] = trace.errors
    assert (error.type, error.retryable) == ("HarnessError", False) and "TypeError" in error.message


async def test_a_prompt_the_tokenizer_cannot_encode_fails_the_rollouts_without_a_model_call(tokenizer):
    """The char tokenizer would read `é` as `?`: the rollouts fail (not retryable: the prompt is
    the same each time) instead of training on a prompt nobody wrote."""
    task = Task("train", 0, "k", "café", {"answer": "éfac"})
    client = FakeClient(tokenizer)
    traces = await run(ENV, tokenizer, client, RolloutJob("rt", task, plan(), "grp", ["grp/0", "grp/1"]))
    assert client.calls == []
    for trace in traces:
        [error] = trace.errors
        assert (error.type, error.retryable) == ("PromptNotEncodable", False)
        assert "the user prompt 'café' holds characters the tokenizer cannot encode: 'é'" in error.message


async def test_a_rollout_past_its_time_is_a_retryable_timeout(tokenizer):
    traces = await run(ENV, tokenizer, FakeClient(tokenizer, hang=True), job(n=2), timeout_s=0.05)
    for trace in traces:
        [error] = trace.errors
        assert (error.type, error.retryable, trace.stop_condition) == ("Timeout", True, "error")


async def test_cancelling_returns_cancelled_traces(tokenizer):
    cancelled = asyncio.Event()
    running = asyncio.ensure_future(
        run(ENV, tokenizer, FakeClient(tokenizer, hang=True), job(n=2), cancelled=cancelled)
    )
    await asyncio.sleep(0.01)
    cancelled.set()
    for trace in await running:
        assert trace.stop_condition == "cancelled" and trace.errors == [CANCELLED]


@pytest.mark.parametrize(
    "score",
    [ZeroDivisionError("division by zero"), Score.of("similarity", math.nan), Score({}, {"m": math.inf})],
)
async def test_a_failing_or_non_finite_scorer_is_a_scoring_error(tokenizer, score):
    class BadScorer(ReverseText):
        def score(self, task, episode):
            if isinstance(score, Exception):
                raise score
            return score

    [trace] = await run(BadScorer(), tokenizer, FakeClient(tokenizer), job(n=1))
    [error] = trace.errors
    assert (error.type, error.retryable) == ("ScoringError", False)
    trace.validate()


async def test_group_scoring_gets_the_finished_episodes_together(tokenizer):
    class Ranked(ReverseText):
        def score_group(self, task, episodes):
            return [Score.of("rank", i) for i in range(len(episodes))]

    traces = await run(Ranked(), tokenizer, FakeClient(tokenizer), job(n=3))
    assert [t.reward for t in traces] == [0, 1, 2]


async def test_a_rule_target_answers_with_the_reference_solution(tokenizer):
    client = FakeClient(tokenizer)
    traces = await run(ENV, tokenizer, client, job(n=2, the_plan=plan("rule", member="oracle")))
    answer = ENV.taskset.get("train", 3).data["answer"]
    assert client.calls == []
    for trace in traces:
        node = trace.nodes[-1]
        assert node.token_ids[1:] == tokenizer.encode(answer) + [tokenizer.eos_token_id]
        assert node.logprobs == [0.0] * (len(answer) + 1)
        assert trace.reward == pytest.approx(1.0) and trace.member_id == "policy"


async def test_a_rule_target_without_reference_answer_fails_the_rollouts(tokenizer):
    class NoReference(ReverseText):
        reference_answer = Environment.reference_answer

    [trace] = await run(NoReference(), tokenizer, FakeClient(tokenizer), job(n=1, the_plan=plan("rule")))
    assert trace.errors[0].type == "HarnessError" and "NotImplementedError" in trace.errors[0].message


def test_rule_model_keeps_the_token_budget(tokenizer):
    full = RuleModel(tokenizer, "abcdef", max_tokens=10).completion
    cut = RuleModel(tokenizer, "abcdef", max_tokens=4).completion
    assert (len(full.token_ids), full.finish_reason) == (7, "stop")
    assert (cut.token_ids, cut.finish_reason, cut.logprobs) == (tokenizer.encode("abcd"), "length", [0.0] * 4)


async def test_inference_model_seeds_each_call_and_never_overruns_the_context(tokenizer):
    client = FakeClient(tokenizer, answer="x")
    sampling = SamplingParams(max_tokens=12, seed=7)
    model = InferenceModel(client, ["a:1"], sampling, max_model_len=10, request_id="g")
    await model.complete([1] * 4, 2)
    await model.complete([1] * 6, 1)
    assert [(c[2].seed, c[2].max_tokens, c[2].n, c[3]) for c in client.calls] == [
        (7, 6, 2, "g:0"),
        (8, 4, 1, "g:1"),
    ]
    full = await model.complete([1] * 10, 3)
    assert [(c.token_ids, c.finish_reason) for c in full] == [([], "length")] * 3
    assert len(client.calls) == 2


def test_error_traces_cover_every_rollout_of_the_job():
    traces = error_traces(job(n=3), CANCELLED, stop="cancelled")
    assert [t.id for t in traces] == ["grp/0", "grp/1", "grp/2"]
    for trace in traces:
        trace.validate()
        assert trace.stop_condition == "cancelled" and trace.nodes == []


class SlowSetupHarness(SingleTurnHarness):
    """Setting the group up takes 0.3 s (a sandbox, say); generation is the fake's, instant."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.prepared: list[int] = []

    async def setup(self, episodes):
        await asyncio.sleep(0.3)
        if self.fail:
            raise RuntimeError("no sandbox")
        self.prepared.append(len(episodes))


class SlowSetupEnv(ReverseText):
    def __init__(self, fail: bool = False):
        super().__init__()
        self.harness = SlowSetupHarness(fail)


async def test_setup_time_is_its_own_phase_of_the_trace_timing(tokenizer):
    env = SlowSetupEnv()
    traces = await run(env, tokenizer, FakeClient(tokenizer))
    assert env.harness.prepared == [4]  # once per group, before the model calls
    for trace in traces:
        timing = trace.timing
        assert timing["setup_s"] >= 0.3
        assert timing["generation_s"] < 0.3  # the setup is not counted as generation
        assert timing["total_s"] >= timing["setup_s"] + timing["generation_s"]


async def test_a_failing_setup_fails_the_groups_episodes(tokenizer):
    client = FakeClient(tokenizer)
    traces = await run(SlowSetupEnv(fail=True), tokenizer, client)
    assert client.calls == []
    assert all(t.errors and "no sandbox" in t.errors[0].message for t in traces)
    assert all(t.timing["setup_s"] >= 0.3 for t in traces)
