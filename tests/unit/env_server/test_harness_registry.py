"""The harness registry (issue 34 item 6): a harness chosen per env entry, the env's own
otherwise."""

from __future__ import annotations

import pytest

from rlrun.common.config import EnvConfig
from rlrun.env_server.envs.registry import make_env
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.harnesses import MultiTurnHarness, SingleTurnHarness, ToolCallingHarness


class EchoHarness(Harness):
    def __init__(self, env=None, prefix: str = ""):
        self.env = env
        self.prefix = prefix

    async def run(self, episode) -> None:
        episode.finish("completed")


class PlainHarness(Harness):
    def __init__(self, times: int = 1):
        self.times = times

    async def run(self, episode) -> None:
        episode.finish("completed")


def test_without_a_harness_entry_the_env_keeps_its_own():
    assert isinstance(make_env("tool-calc", {}).harness, ToolCallingHarness)
    assert isinstance(make_env("alphabet-sort", {}).harness, SingleTurnHarness)


def test_builtin_harness_ids_take_what_they_need_from_the_env():
    env = make_env(
        "alphabet-sort", {}, {"id": "multi-turn", "args": {"max_turns": 4, "rewrite_history": True}}
    )
    assert isinstance(env.harness, MultiTurnHarness)
    assert (env.harness.max_turns, env.harness.rewrite_history) == (4, True)
    assert env.harness.respond == env.feedback
    env = make_env("tool-calc", {}, {"id": "single-turn"})
    assert isinstance(env.harness, SingleTurnHarness)
    env = make_env("tool-calc", {}, {"id": "tool-calling", "args": {"max_tool_calls": 5}})
    assert env.harness.max_tool_calls == 5 and set(env.harness.tools) == {"calc"}


def test_an_import_path_names_a_harness_class_built_with_its_args_and_the_env():
    env = make_env("reverse-text", {}, {"id": f"{__name__}:EchoHarness", "args": {"prefix": ">"}})
    assert isinstance(env.harness, EchoHarness) and env.harness.env is env and env.harness.prefix == ">"
    env = make_env("reverse-text", {}, {"id": f"{__name__}:PlainHarness", "args": {"times": 2}})
    assert env.harness.times == 2


@pytest.mark.parametrize(
    ("harness", "message"),
    [
        ({"id": "multi-turn"}, "needs the env's `feedback`, which ReverseText does not have"),
        ({"id": "tool-calling"}, "needs the env's `tools`"),
        ({"id": "nope"}, "unknown harness 'nope'; built-in ids are"),
        ({"id": "json:loads"}, "is not a Harness subclass"),
        ({"id": "single-turn", "args": {"x": 1}}, "bad args ['x']"),
    ],
)
def test_a_harness_that_cannot_be_built_is_an_error_naming_it(harness, message):
    with pytest.raises(ValueError, match="environment 'reverse-text'") as error:
        make_env("reverse-text", {}, harness)
    assert message in str(error.value)


def test_a_multi_agent_env_keeps_its_turn_harness():
    with pytest.raises(ValueError, match="is multi-agent"):
        make_env("debate", {}, {"id": "single-turn"})


def test_the_env_entry_takes_a_harness_table():
    entry = EnvConfig.model_validate(
        {"id": "alphabet-sort", "harness": {"id": "multi-turn", "args": {"max_turns": 2}}}
    )
    assert entry.harness is not None and entry.harness.model_dump() == {
        "id": "multi-turn",
        "args": {"max_turns": 2},
    }
    assert EnvConfig.model_validate({"id": "x"}).harness is None
