"""Environment registry (`rlrun.common.registry`): built-in ids, installed environments
(entry point group `rlrun.envs`, found by the env-server and every worker without a hand
import), or `package.module:Class` for environments that live outside rlrun (the module must
be importable by the env-server and its workers)."""

from __future__ import annotations

import inspect
from typing import Any

from rlrun.common.registry import Registry
from rlrun.env_server.runtimes.registry import RuntimeOptionError, make_runtime
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.harnesses.registry import make_harness

BUILTIN: Registry[type[Environment]] = Registry("environment", "rlrun.envs", Environment)
"""Imported when first used (the `dataset` env's optional packages only then)."""
BUILTIN.register_path("reverse-text", "rlrun.env_server.envs.reverse_text:ReverseText")
BUILTIN.register_path("alphabet-sort", "rlrun.env_server.envs.alphabet_sort:AlphabetSort")
BUILTIN.register_path("arithmetic", "rlrun.env_server.envs.arithmetic:Arithmetic")
BUILTIN.register_path("tool-calc", "rlrun.env_server.envs.tool_calc:ToolCalc")
BUILTIN.register_path("code-sandbox", "rlrun.env_server.envs.code_sandbox:CodeSandbox")
BUILTIN.register_path("debate", "rlrun.env_server.envs.debate:Debate")
BUILTIN.register_path("dataset", "rlrun.env_server.envs.dataset:DatasetEnv")


VERIFIERS = "vf:"
"""`vf:<name>`: the verifiers v1 environment whose taskset id is <name> (verifiers_env.py)."""


def resolve(env_id: str) -> type[Environment]:
    """The Environment class of a built-in id, a verifiers env or an import path; ValueError
    when there is none."""
    if env_id.startswith(VERIFIERS):
        from rlrun.env_server.envs.verifiers.env import VerifiersEnv

        return VerifiersEnv
    return BUILTIN.resolve(env_id)


def env_args(env_id: str, args: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the env's class is built with: the entry's `args` (and, for a
    verifiers env, its taskset id as `env_name`)."""
    if env_id.startswith(VERIFIERS):
        return {"env_name": env_id.removeprefix(VERIFIERS), **args}
    return dict(args)


def make_env(
    env_id: str,
    args: dict[str, Any],
    harness: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
) -> Environment:
    """Builds the environment with the entry's `args` as keyword arguments; with `runtime` (the
    entry's `{type, ...}`), that sandbox backend is the env's `runtime` argument
    (runtimes/registry.py; RuntimeOptionError naming the option that is wrong); with `harness` (the entry's `{id, args}`), that harness
    replaces the env's own (harnesses/registry.py)."""
    cls = resolve(env_id)
    args = env_args(env_id, args)
    if runtime is not None:
        if "runtime" not in inspect.signature(cls).parameters:
            raise RuntimeOptionError(
                "type", f"environment {env_id!r} runs no commands: its class takes no `runtime`"
            )
        args["runtime"] = make_runtime(runtime)
    try:
        env = cls(**args)
    except TypeError as error:
        raise ValueError(f"environment {env_id!r}: bad args {sorted(args)}: {error}") from None
    if harness is not None:
        try:
            env.harness = make_harness(harness["id"], dict(harness.get("args", {})), env)
        except ValueError as error:
            raise ValueError(f"environment {env_id!r}: {error}") from None
    return env
