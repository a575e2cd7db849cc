"""Multi-agent episodes: turn schedules (sequential and atomic simultaneous slots), per-member
views with a private think channel, one trace per member, and per-member rewards that must
cover every member."""

from __future__ import annotations

import asyncio

import pytest

from rlrun.common.errors import RequestError
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint, PlanTarget
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.trace import TraceError, trace_from_proto, trace_to_proto
from rlrun.env_server.envs.arithmetic import Arithmetic
from rlrun.env_server.sdk.channels import public_text
from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.errors import ModelCallError
from rlrun.env_server.sdk.harnesses import TurnHarness
from rlrun.env_server.sdk.multi_agent import MultiAgentEpisode, learner_seat
from rlrun.env_server.sdk.task import MemberScores, Score, Task
from rlrun.env_server.sdk.taskset import Taskset
from rlrun.env_server.server.rollout import RolloutJob, Runtime, error_traces, run_rollouts, start_episodes

TASK = Task("train", 0, "q0", "1+1", {"answer": "2"})


class Failing:
    """A model whose call fails after `delay_s` (or never returns when delay_s is None)."""

    def __init__(self, delay_s: float | None = 0.0):
        self.delay_s = delay_s

    async def complete(self, prompt_ids, n=1):
        if self.delay_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay_s)
        raise ModelCallError("UNAVAILABLE", "replica down", retryable=True)


def episode(tokenizer, models, roles=None, index=0, prompts=None) -> MultiAgentEpisode:
    conversations = {}
    for member in models:
        conversations[member] = Conversation(tokenizer)
        conversations[member].add_prompt((prompts or {}).get(member, TASK.prompt))
    return MultiAgentEpisode(
        TASK, conversations, dict(models), roles or dict.fromkeys(models, "fixed"), index
    )


def texts(tokenizer, prompt_ids) -> str:
    return tokenizer.decode(prompt_ids, skip_special_tokens=False)


def assistant_nodes(conversation):
    return [n for n in conversation.graph.nodes if n.role == "assistant"]


# -- the public channel ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "public"),
    [
        ("42", "42"),
        ("<think>a is 4</think>42", "42"),
        ("<think>x</think> 4 <think>y</think>2 ", "4 2"),
        ("<think></think>", ""),
        ("<think>never closed 42", None),
        ("42</think>", None),
        ("</think>42<think>", None),
        ("<think>a<think>b</think></think>", None),
        ("<think>a</think>42</think>", None),
    ],
)
def test_the_public_channel_drops_think_blocks_and_rejects_malformed_markup(text, public):
    assert public_text(text) == public


# -- slots ----------------------------------------------------------------------------------------


async def test_a_simultaneous_slot_speaks_on_the_same_history(tokenizer, scripted):
    a, b = scripted(lambda i, p: "7"), scripted(lambda i, p: "8")
    ep = episode(tokenizer, {"a": a, "b": b})
    await ep.play(("a", "b"))
    # Neither saw the other's answer of the slot: both prompts are the bare question.
    assert texts(tokenizer, a.calls[0][0]) == texts(tokenizer, b.calls[0][0])
    assert "7" not in tokenizer.decode(b.calls[0][0]) and "8" not in tokenizer.decode(a.calls[0][0])
    assert [(m.speaker, m.text) for m in ep.public] == [("a", "7"), ("b", "8")]


async def test_a_sequential_slot_sees_the_public_messages_before_it(tokenizer, scripted):
    a, b = scripted(lambda i, p: "7"), scripted(lambda i, p: "8")
    ep = episode(tokenizer, {"a": a, "b": b})
    await ep.play(("a",))
    await ep.play(("b",))
    assert tokenizer.decode(b.calls[0][0]).endswith("a: 7")
    await ep.play(("a",))
    # a catches up on b's message only (its own message is already its assistant turn).
    assert tokenizer.decode(a.calls[1][0]) == "1+17b: 8"


@pytest.mark.parametrize("delay_s", [0.0, 0.05])
async def test_a_simultaneous_slot_commits_nothing_when_a_member_fails(tokenizer, scripted, delay_s):
    a = scripted(lambda i, p: "7")
    ep = episode(tokenizer, {"a": a, "b": Failing(delay_s)})
    before = {m: len(c.graph.nodes) for m, c in ep.conversations.items()}
    with pytest.raises(ModelCallError):
        await ep.play(("a", "b"))
    assert len(a.calls) == 1  # a answered, and yet:
    assert {m: len(c.graph.nodes) for m, c in ep.conversations.items()} == before
    assert ep.public == [] and ep.conversations["a"].completions == []


async def test_a_cancelled_simultaneous_slot_commits_nothing(tokenizer, scripted):
    a = scripted(lambda i, p: "7")
    ep = episode(tokenizer, {"a": a, "b": Failing(delay_s=None)})
    play = asyncio.ensure_future(ep.play(("a", "b")))
    await asyncio.sleep(0.02)
    assert len(a.calls) == 1 and not play.done()
    play.cancel()
    await asyncio.gather(play, return_exceptions=True)
    assert ep.public == [] and all(not assistant_nodes(c) for c in ep.conversations.values())


async def test_a_slot_naming_an_unknown_or_repeated_member_is_refused(tokenizer, scripted):
    ep = episode(tokenizer, {"a": scripted(lambda i, p: "7")})
    with pytest.raises(ValueError, match="not members"):
        await ep.play(("a", "z"))
    with pytest.raises(ValueError, match="distinct"):
        await ep.play(("a", "a"))
    with pytest.raises(ValueError, match="distinct"):
        TurnHarness([("a",), ()])


# -- views and the think channel ------------------------------------------------------------------


async def test_thinking_stays_private_to_its_member(tokenizer, scripted):
    a = scripted(lambda i, p: "<think>secret plan</think>42")
    b = scripted(lambda i, p: "43")
    ep = episode(tokenizer, {"a": a, "b": b})
    await ep.play(("a",))
    await ep.play(("b",))
    await ep.play(("a",))
    seen_by_b = tokenizer.decode(b.calls[0][0])
    assert "42" in seen_by_b and "secret" not in seen_by_b and "think" not in seen_by_b
    # a's own history keeps its thinking, as sampled (it trains on it).
    [first, _] = assistant_nodes(ep.conversations["a"])
    assert first.content == "<think>secret plan</think>42" and not first.parse_error
    assert "secret plan" in tokenizer.decode(a.calls[1][0])
    assert ep.public_answer("a") == "42"


async def test_malformed_think_markup_is_quarantined(tokenizer, scripted):
    a = scripted(lambda i, p: "<think>secret 42")
    b = scripted(lambda i, p: "43")
    ep = episode(tokenizer, {"a": a, "b": b})
    await ep.play(("a",))
    await ep.play(("b",))
    [node] = assistant_nodes(ep.conversations["a"])
    assert node.parse_error and node.content == "<think>secret 42"
    assert tokenizer.decode(b.calls[0][0]).endswith("a: ")  # b learns that a spoke, nothing more
    assert ep.public_answer("a") == ""
    assert not any(n.parse_error for n in ep.conversations["b"].graph.nodes)


async def test_a_view_may_hide_a_speaker(tokenizer, scripted):
    judge = scripted(lambda i, p: "a")
    a = scripted(lambda i, p: "7")
    ep = episode(tokenizer, {"a": a, "judge": judge})
    hide_judge = lambda viewer, message: None if message.speaker == "judge" else f"<{message.text}>"  # noqa: E731
    await ep.play(("a",), hide_judge)
    await ep.play(("judge",), hide_judge)
    await ep.play(("a",), hide_judge)
    assert tokenizer.decode(judge.calls[0][0]).endswith("<7>")
    assert tokenizer.decode(a.calls[1][0]) == tokenizer.decode(a.calls[0][0]) + "7"


def test_the_learner_seat_is_the_train_seat_and_rotates_in_self_play(tokenizer, scripted):
    models = {"x": None, "y": None, "judge": None}
    one = episode(tokenizer, models, roles={"x": "fixed", "y": "train", "judge": "fixed"}, index=3)
    assert learner_seat(one, ("x", "y")) == "y"
    both = {"x": "train", "y": "train", "judge": "fixed"}
    assert [learner_seat(episode(tokenizer, models, both, index=i), ("x", "y")) for i in range(4)] == [
        "x",
        "y",
        "x",
        "y",
    ]
    with pytest.raises(ValueError, match="no seat"):
        learner_seat(episode(tokenizer, models, dict.fromkeys(models, "fixed")), ("x", "y"))


# -- the runner: one trace per member, rewards covering every member ----------------------------------


class Duel(Environment):
    """Two players answer 1+1 at once; the one who is right wins. `cover` picks who gets scored."""

    members = ("alice", "bob")

    def __init__(self, cover=("alice", "bob"), return_score=False):
        self.taskset = Arithmetic().taskset
        self.harness = TurnHarness([("alice", "bob")], seats=("alice", "bob"))
        self.cover = cover
        self.return_score = return_score

    def rule_reply(self, task, episode, member, target):
        return task.data["answer"] if member == "alice" else "0"

    def score(self, task, episode):
        if self.return_score:
            return Score.of("x", 1.0)
        right = {m: float(episode.public_answer(m) == task.data["answer"]) for m in self.cover}
        return MemberScores({m: Score.of("won", right[m]) for m in self.cover})


def duel_plan(kind="rule") -> GenerationPlan:
    sampling = SamplingParams(max_tokens=8)
    addresses = [] if kind == "rule" else ["i:1"]
    return GenerationPlan(
        {
            "alice": PlanTarget("alice", "train", ModelEndpoint("oracle", kind, addresses), sampling),
            "bob": PlanTarget("bob", "fixed", ModelEndpoint("rules", "rule", []), sampling),
        }
    )


def duel_job(env, n=2) -> RolloutJob:
    return RolloutJob("duel", env.taskset.get("train", 5), duel_plan(), "g", [f"g/{i}" for i in range(n)])


async def run_duel(env, tokenizer, n=2):
    return await run_rollouts(env, duel_job(env, n), Runtime(tokenizer, None, 32), 10.0, asyncio.Event())


async def test_each_member_gets_its_own_trace(tokenizer):
    env = Duel()
    traces = await run_duel(env, tokenizer)
    assert [(t.id, t.rollout_id, t.member_id) for t in traces] == [
        ("g/0/alice", "g/0", "alice"),
        ("g/0/bob", "g/0", "bob"),
        ("g/1/alice", "g/1", "alice"),
        ("g/1/bob", "g/1", "bob"),
    ]
    answer = env.taskset.get("train", 5).data["answer"]
    alice, bob = traces[0], traces[1]
    assert [n.content for n in alice.nodes if n.role == "assistant"] == [answer]
    assert [n.content for n in bob.nodes if n.role == "assistant"] == ["0"]
    assert (alice.reward, bob.reward) == (1.0, 0.0)
    assert all(t.info == {"learner_seat": "alice"} and t.stop_condition == "completed" for t in traces)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (Duel(cover=("alice",)), "missing: ['bob']"),
        (Duel(cover=("alice", "bob", "carol")), "unknown: ['carol']"),
        (Duel(return_score=True), "expected a MemberScores"),
    ],
)
async def test_rewards_must_cover_every_member(tokenizer, env, message):
    if "carol" in env.cover:
        env.score = lambda task, episode: MemberScores({m: Score.of("x", 0.0) for m in env.cover})
    traces = await run_duel(env, tokenizer)
    assert len(traces) == 4
    for trace in traces:
        [error] = trace.errors
        assert error.type == "ScoringError" and message in error.message and not error.retryable
        assert trace.rewards == {}


async def test_a_failing_member_fails_every_trace_of_its_rollout(tokenizer):
    class Client:
        async def generate(self, addresses, prompt_ids, sampling, request_id=""):
            raise ModelCallError("UNAVAILABLE", "down", retryable=True)

    env = Duel()
    the_job = duel_job(env)
    the_job.plan = duel_plan(kind="inference")
    traces = await run_rollouts(env, the_job, Runtime(tokenizer, Client(), 32), 10.0, asyncio.Event())
    assert [t.member_id for t in traces] == ["alice", "bob"] * 2
    assert all(t.errors[0].type == "ModelCallError" and t.errors[0].retryable for t in traces)
    # bob (a rule) answered, but the slot never committed.
    assert all(not any(n.role == "assistant" for n in t.nodes) for t in traces)


def test_rule_players_answer_from_their_own_episode(tokenizer):
    env = Duel()
    episodes = start_episodes(env, duel_job(env, n=3), Runtime(tokenizer, None, 32))
    assert [e.index for e in episodes] == [0, 1, 2]
    replies = {id(e): e.models["bob"].reply.args[1] for e in episodes}
    assert all(replies[id(e)] is e for e in episodes)


def test_error_traces_cover_every_member_of_every_rollout():
    env = Duel()
    traces = error_traces(duel_job(env, n=2), TraceError("WorkerLost", "gone", True), members=env.members)
    assert [t.id for t in traces] == ["g/0/alice", "g/0/bob", "g/1/alice", "g/1/bob"]
    for trace in traces:
        trace.validate()


def test_an_env_without_members_keeps_one_policy_trace_per_rollout():
    env = Duel()
    traces = error_traces(duel_job(env, n=2), TraceError("WorkerLost", "gone", True))
    assert [(t.id, t.member_id) for t in traces] == [("g/0", "policy"), ("g/1", "policy")]


# -- plans a multi-agent env accepts ----------------------------------------------------------------


@pytest.fixture
def debate_host(tmp_path):
    from rlrun.common.config import resolve_config
    from rlrun.common.grpc_client import ClientOptions
    from rlrun.env_server.server.host import EnvHost

    config, _ = resolve_config({"orchestrator": {"train": {"env": [{"id": "debate"}]}}})
    return EnvHost(config.orchestrator.train.env[0], config, tmp_path, ClientOptions())


def debate_plan(*members, kind="rule") -> GenerationPlan:
    sampling = SamplingParams(max_tokens=8)
    return GenerationPlan(
        {
            m: PlanTarget(
                m, "fixed", ModelEndpoint(m, kind, ["i:1"] if kind == "inference" else []), sampling
            )
            for m in members
        }
    )


def test_a_multi_agent_env_needs_a_target_per_member(debate_host):
    assert list(debate_host.info().members) == ["debater_a", "debater_b", "judge"]
    debate_host.check_plan(debate_plan("debater_a", "debater_b", "judge"))
    with pytest.raises(RequestError, match="one target per member") as caught:
        debate_host.check_plan(debate_plan("debater_a", "judge"))
    assert caught.value.field == "plan.targets"
    with pytest.raises(RequestError) as caught:
        debate_host.check_plan(debate_plan("policy"))
    assert caught.value.field == "plan.targets"


def test_rule_targets_need_an_env_with_rules(debate_host):
    class NoRules(Environment):
        members = ("debater_a", "debater_b", "judge")

        def score(self, task, episode):
            return MemberScores({})

    assert debate_host.env.has_rule_reply and not NoRules.__new__(NoRules).has_rule_reply
    debate_host.env = NoRules.__new__(NoRules)
    with pytest.raises(RequestError, match="no rules for its members") as caught:
        debate_host.check_plan(debate_plan("debater_a", "debater_b", "judge"))
    assert caught.value.field == "plan.targets[0].model.kind"
    debate_host.check_plan(debate_plan("debater_a", "debater_b", "judge", kind="inference"))


class IntIds(Taskset):
    """Example ids that are ints, as an env's own taskset may give them."""

    @property
    def sizes(self):
        return {"train": 10, "eval": 1}

    def get(self, split, idx):
        return Task(split, idx, 100 + idx, "1+1", {"answer": "2"})


async def test_int_example_ids_stay_ints_through_traces_and_the_wire(tokenizer):
    env = Duel()
    env.taskset = IntIds()
    traces = await run_duel(env, tokenizer)
    assert {t.task.example_id for t in traces} == {105}
    assert all(trace_from_proto(trace_to_proto(t)).task.example_id == 105 for t in traces)
