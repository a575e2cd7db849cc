from __future__ import annotations

import pytest

from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.episode import POLICY, Episode
from rlrun.env_server.sdk.errors import ToolError
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.harnesses import MultiTurnHarness, SingleTurnHarness, ToolCallingHarness
from rlrun.env_server.sdk.harnesses.tool_calling import parse_tool_call
from rlrun.env_server.sdk.task import Task

TASK = Task("train", 0, "dcba", "dcba", {"answer": "abcd"})


def episodes(tokenizer, model, n: int = 1, task: Task = TASK) -> list[Episode]:
    out = []
    for _ in range(n):
        conversation = Conversation(tokenizer)
        conversation.add_prompt(task.prompt)
        out.append(Episode(task, {POLICY: conversation}, {POLICY: model}))
    return out


async def test_single_turn_runs_a_group_as_one_call_with_n(tokenizer, scripted):
    model = scripted(lambda i, prompt: "abcd")
    group = episodes(tokenizer, model, n=8)
    await SingleTurnHarness().run_group(group)
    assert [n for _, n in model.calls] == [8]
    assert all(e.stop == "completed" and e.answer == "abcd" for e in group)


async def test_single_turn_reports_truncation(tokenizer, scripted):
    [episode] = episodes(tokenizer, scripted(lambda i, prompt: "abcdefgh", max_tokens=3))
    await SingleTurnHarness().run(episode)
    assert episode.stop == "length" and episode.conversation.truncated


async def test_multi_turn_feedback_is_a_user_message_and_turns_extend_the_prefix(tokenizer, scripted):
    answers = ["abdc", "acbd", "abcd"]
    model = scripted(lambda i, prompt: answers[i])

    def respond(task, episode):
        return None if episode.answer == task.data["answer"] else "no"

    [episode] = episodes(tokenizer, model)
    await MultiTurnHarness(respond, max_turns=5).run(episode)
    assert episode.stop == "completed" and episode.metrics["turns"] == 3
    prompts = [prompt for prompt, _ in model.calls]
    for earlier, later in zip(prompts, prompts[1:], strict=False):
        assert later[: len(earlier)] == earlier
    roles = [m.role for m in episode.conversation.messages()]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]


async def test_multi_turn_stops_at_max_turns_and_accepts_async_feedback(tokenizer, scripted):
    async def respond(task, episode):
        return "no"

    [episode] = episodes(tokenizer, scripted(lambda i, prompt: "zz"))
    await MultiTurnHarness(respond, max_turns=2).run(episode)
    assert episode.stop == "max_turns"
    assert [m.role for m in episode.conversation.messages()] == ["user", "assistant", "user", "assistant"]


async def test_rewritten_history_gives_the_model_only_the_latest_feedback(tokenizer, scripted):
    model = scripted(lambda i, prompt: "zz")
    [episode] = episodes(tokenizer, model)
    await MultiTurnHarness(lambda task, e: f"{e.answer} 0/4", max_turns=3, rewrite_history=True).run(episode)
    prompt = tokenizer.render_message("user", "dcba")
    header = tokenizer.message_header("assistant")
    assert model.calls[1][0] == prompt + tokenizer.render_message("user", "zz 0/4") + header
    assert model.calls[2][0] == model.calls[1][0]
    assert len(episode.conversation.graph.branches()) == 3


@pytest.mark.parametrize(
    ("text", "call"),
    [
        ("calc(1+2)", ("calc", "1+2")),
        (" calc( 3*4 ) ", ("calc", " 3*4 ")),
        ("42", None),
        ("calc 1+2", None),
        ("calc(1", None),
    ],
)
def test_parse_tool_call(text, call):
    assert parse_tool_call(text) == call


async def test_tool_results_are_tool_messages_the_model_sees(tokenizer, scripted):
    model = scripted(lambda i, prompt: ["calc(2*21)", "42"][i])
    [episode] = episodes(tokenizer, model)
    await ToolCallingHarness({"calc": lambda args: str(eval(args))}).run(episode)
    assert episode.stop == "completed" and episode.answer == "42" and episode.metrics["tool_calls"] == 1
    nodes = episode.conversation.graph.nodes
    tool = nodes[2]
    assert (tool.role, tool.content, tool.is_observation) == ("tool", "42", True)
    assert model.calls[1][0] == model.calls[0][0] + nodes[1].token_ids[
        1:
    ] + tool.token_ids + tokenizer.message_header("assistant")


async def test_tool_errors_and_unknown_tools_are_shown_to_the_model(tokenizer, scripted):
    def failing(args):
        raise ToolError("bad input")

    async def echo(args):
        return args

    model = scripted(lambda i, prompt: ["calc(x)", "nope(1)", "echo(hi)", "done"][i])
    [episode] = episodes(tokenizer, model)
    await ToolCallingHarness({"calc": failing, "echo": echo}, max_tool_calls=3).run(episode)
    tools = [n.content for n in episode.conversation.graph.nodes if n.role == "tool"]
    assert tools == ["error: bad input", "error: unknown tool nope", "hi"]
    assert episode.stop == "completed"


async def test_tool_calls_beyond_the_budget_end_the_episode(tokenizer, scripted):
    [episode] = episodes(tokenizer, scripted(lambda i, prompt: "calc(1)"))
    await ToolCallingHarness({"calc": lambda args: "1"}, max_tool_calls=2).run(episode)
    assert episode.stop == "max_turns" and episode.metrics["tool_calls"] == 2


async def test_a_tool_bug_is_not_swallowed(tokenizer, scripted):
    def buggy(args):
        raise TypeError("oops")

    [episode] = episodes(tokenizer, scripted(lambda i, prompt: "calc(1)"))
    with pytest.raises(TypeError):
        await ToolCallingHarness({"calc": buggy}).run(episode)


async def test_default_group_run_keeps_each_episodes_failure_to_itself(tokenizer, scripted):
    model = scripted(lambda i, prompt: "abcd")

    class SometimesBroken(Harness):
        async def run(self, episode):
            if episode is group[1]:
                raise ValueError("only this one")
            await episode.generate()
            episode.finish()

    group = episodes(tokenizer, model, n=3)
    await SometimesBroken().run_group(group)
    assert [e.error is not None for e in group] == [False, True, False]
    assert group[0].stop == group[2].stop == "completed"
    assert [n for _, n in model.calls] == [1, 1]
