"""Harness registry: a harness chosen per env entry (`harness = {id = ..., args = {...}}`),
instead of the one the env builds itself (its default).

Built-in ids take what they need from the env:
- `single-turn`: prompt in, one answer out. No args.
- `multi-turn`: the env's `feedback(task, episode)` answers each turn (None ends the episode);
  args `max_turns`, `rewrite_history`.
- `tool-calling`: the env's `tools` (name -> callable); args `max_tool_calls`.
- `sandbox-tools`: `bash`, `read_file`, `write_file`, `run_tests` in the env's `runtime` (and its
  `grade`, if it has one); args `max_tool_calls`, `timeout_s`.
An installed harness (entry point group `rlrun.harnesses`) or an import path
`package.module:Class` names a Harness subclass, built with the args as keyword arguments (plus
`env=` when its constructor takes an `env` parameter). The registry is `rlrun.common.registry`'s.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlrun.common.registry import Registry
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.harnesses.multi_turn import MultiTurnHarness
from rlrun.env_server.sdk.harnesses.sandbox_tools import SandboxToolHarness
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


HARNESSES: Registry[Callable[..., Harness]] = Registry("harness", "rlrun.harnesses", Harness)
"""Built-in ids as factories `(env, **args) -> Harness` (they take what they need from the env);
installed ones and import paths as Harness subclasses."""
HARNESSES.register("single-turn", lambda env, **args: SingleTurnHarness(**args))
HARNESSES.register(
    "multi-turn", lambda env, **args: MultiTurnHarness(_needs(env, "feedback", "multi-turn"), **args)
)
HARNESSES.register(
    "tool-calling", lambda env, **args: ToolCallingHarness(_needs(env, "tools", "tool-calling"), **args)
)
HARNESSES.register(
    "sandbox-tools",
    lambda env, **args: SandboxToolHarness(
        _needs(env, "runtime", "sandbox-tools"), getattr(env, "grade", None), **args
    ),
)


def _factory(cls: type[Harness]) -> Callable[..., Harness]:
    cls_: Any = cls  # a concrete subclass, whose constructor takes the args
    takes_env = "env" in inspect.signature(cls).parameters

    def build(env: Environment, **args: Any) -> Harness:
        return cls_(env=env, **args) if takes_env else cls_(**args)

    return build


def make_harness(harness_id: str, args: dict[str, Any], env: Environment) -> Harness:
    """The harness `harness_id` for `env`, built with `args`; ValueError naming what is wrong."""
    entry = HARNESSES.resolve(harness_id)
    factory = _factory(entry) if isinstance(entry, type) else entry
    if env.members:
        raise ValueError(
            f"harness {harness_id!r}: {type(env).__name__} is multi-agent; its turn harness is its own"
        )
    try:
        return factory(env, **args)
    except TypeError as error:
        raise ValueError(f"harness {harness_id!r}: bad args {sorted(args)}: {error}") from None
