"""Environment registry: built-in ids, or `package.module:Class` for environments that live
outside rlrun (the module must be importable by the env-server and its workers)."""

from __future__ import annotations

import importlib
from typing import Any

from rlrun.common.errors import did_you_mean
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.harnesses.registry import make_harness

BUILTIN: dict[str, str] = {
    "reverse-text": "rlrun.env_server.envs.reverse_text:ReverseText",
    "alphabet-sort": "rlrun.env_server.envs.alphabet_sort:AlphabetSort",
    "arithmetic": "rlrun.env_server.envs.arithmetic:Arithmetic",
    "tool-calc": "rlrun.env_server.envs.tool_calc:ToolCalc",
    "debate": "rlrun.env_server.envs.debate:Debate",
    "dataset": "rlrun.env_server.envs.dataset:DatasetEnv",
}


VERIFIERS = "vf:"
"""`vf:<name>`: the verifiers v1 environment whose taskset id is <name> (verifiers_env.py)."""


def resolve(env_id: str) -> type[Environment]:
    """The Environment class of a built-in id, a verifiers env or an import path; ValueError
    when there is none."""
    if env_id.startswith(VERIFIERS):
        from rlrun.env_server.envs.verifiers.env import VerifiersEnv

        return VerifiersEnv
    path = BUILTIN.get(env_id, env_id)
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise ValueError(
            f"unknown environment {env_id!r}{did_you_mean(env_id, BUILTIN)}; built-in ids are "
            f"{sorted(BUILTIN)}, or give an import path `package.module:Class` (docs/environments.md)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"environment {env_id!r}: cannot import {module_name}: {error}; is the folder that holds "
            "it on PYTHONPATH? (`rlrun local` passes PYTHONPATH on to every service)"
        ) from None
    try:
        cls = getattr(module, attr)
    except AttributeError:
        names = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Environment)]
        raise ValueError(
            f"environment {env_id!r}: module {module_name} has no {attr!r}{did_you_mean(attr, names)}"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"environment {env_id!r}: {path} is not an Environment subclass")
    return cls


def env_args(env_id: str, args: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the env's class is built with: the entry's `args` (and, for a
    verifiers env, its taskset id as `env_name`)."""
    if env_id.startswith(VERIFIERS):
        return {"env_name": env_id.removeprefix(VERIFIERS), **args}
    return dict(args)


def make_env(env_id: str, args: dict[str, Any], harness: dict[str, Any] | None = None) -> Environment:
    """Builds the environment with the entry's `args` as keyword arguments; with `harness`
    (the entry's `{id, args}`), that harness replaces the env's own (harnesses/registry.py)."""
    cls = resolve(env_id)
    args = env_args(env_id, args)
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
