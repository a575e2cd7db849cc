"""Harness registry: a harness chosen per env entry (`harness = {id = ..., args = {...}}`),
instead of the one the env builds itself (its default).

Built-in ids take what they need from the env:
- `single-turn`: prompt in, one answer out. No args.
- `multi-turn`: the env's `feedback(task, episode)` answers each turn (None ends the episode);
  args `max_turns`, `rewrite_history`.
- `tool-calling`: the env's `tools` (name -> callable); args `max_tool_calls`.
Any other id is an import path `package.module:Class` of a Harness subclass, built with the
args as keyword arguments (plus `env=` when its constructor takes an `env` parameter).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.harnesses.multi_turn import MultiTurnHarness
from rlrun.env_server.sdk.harnesses.single_turn import SingleTurnHarness
from rlrun.env_server.sdk.harnesses.tool_calling import ToolCallingHarness

if TYPE_CHECKING:
    from rlrun.env_server.sdk.environment import Environment


def _needs(env: Environment, attribute: str, harness_id: str) -> Any:
    value = getattr(env, attribute, None)
    if value is None:
        raise ValueError(
            f"harness {harness_id!r} needs the env's `{attribute}`, which {type(env).__name__} does not have"
        )
    return value


BUILTIN: dict[str, Callable[..., Harness]] = {
    "single-turn": lambda env, **args: SingleTurnHarness(**args),
    "multi-turn": lambda env, **args: MultiTurnHarness(_needs(env, "feedback", "multi-turn"), **args),
    "tool-calling": lambda env, **args: ToolCallingHarness(_needs(env, "tools", "tool-calling"), **args),
}


def _import(harness_id: str) -> Callable[..., Harness]:
    module_name, sep, attr = harness_id.partition(":")
    if not sep:
        raise ValueError(
            f"unknown harness {harness_id!r}; built-in ids are {sorted(BUILTIN)}, "
            "or give an import path `package.module:Class`"
        )
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"harness {harness_id!r}: cannot import it: {error}") from None
    if not (isinstance(cls, type) and issubclass(cls, Harness)):
        raise ValueError(f"harness {harness_id!r} is not a Harness subclass")
    cls_: Any = cls  # a concrete subclass, whose constructor takes the args
    takes_env = "env" in inspect.signature(cls).parameters

    def build(env: Environment, **args: Any) -> Harness:
        return cls_(env=env, **args) if takes_env else cls_(**args)

    return build


def make_harness(harness_id: str, args: dict[str, Any], env: Environment) -> Harness:
    """The harness `harness_id` for `env`, built with `args`; ValueError naming what is wrong."""
    factory = BUILTIN.get(harness_id) or _import(harness_id)
    if env.members:
        raise ValueError(
            f"harness {harness_id!r}: {type(env).__name__} is multi-agent; its turn harness is its own"
        )
    try:
        return factory(env, **args)
    except TypeError as error:
        raise ValueError(f"harness {harness_id!r}: bad args {sorted(args)}: {error}") from None
