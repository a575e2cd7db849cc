"""Checks of a run file that need more than its schema but start nothing (`rlrun check-config`;
the operator renders the same algorithm check into its config validation).

- `check_algorithms`: every algorithm id the run uses is builtin (its `algorithm_args` table
  validates) or may be owned by an env; a table for an algorithm the run does not use is an
  error that names it. Needs only the config.
- `check_environment`: the files the run reads exist, the env ids of the env-servers rlrun
  starts resolve, their `args` bind to the env's constructor, an env that owns no algorithms
  is not asked for one, and the configured torch devices exist.

This module is outside the service packages on purpose: it reads the orchestrator's algorithm
registry and the env-server's env registry, which no service may import from another.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from rlrun.common.config import ConfigError, RunConfig
from rlrun.common.config.orchestrator import OrchestratorConfig
from rlrun.common.errors import describe_validation_error


def used_algorithms(orch: OrchestratorConfig) -> dict[str, str]:
    """Every algorithm id the run uses, with the config key it is named at (first mention)."""
    used: dict[str, str] = {}
    for name in orch.algorithms:
        used.setdefault(name, "orchestrator.algorithms")
    for i, env in enumerate(orch.train.env):
        for name in env.algorithms or []:
            used.setdefault(name, f"orchestrator.train.env.{i}.algorithms")
    if orch.warm_start.max_steps:
        used.setdefault(orch.warm_start.algorithm, "orchestrator.warm_start.algorithm")
    return used


def check_algorithms(orch: OrchestratorConfig) -> None:
    """Builtin ids' args validate; tables of algorithms the run does not use are errors."""
    from rlrun.orchestrator.credit.algorithms import builtin

    used = used_algorithms(orch)
    for name in orch.algorithm_args:
        if name not in used:
            raise ConfigError(
                f"orchestrator.algorithm_args.{name}",
                f"a table for algorithm {name!r}, which the run does not use "
                f"(it uses: {', '.join(sorted(used))}); remove the table or add {name!r} to the algorithms",
            )
    for name in used:
        cls = builtin(name)
        if cls is None:
            continue  # an env's own algorithm: check_environment checks what it can
        try:
            cls.Args.model_validate(orch.algorithm_args.get(name, {}))
        except ValueError as error:
            raise ConfigError(
                f"orchestrator.algorithm_args.{name}", describe_validation_error(error)
            ) from None


def _check_file(key: str, path: Path | None) -> None:
    if path is not None and not Path(path).exists():
        raise ConfigError(key, f"{path} does not exist")


def _check_device(key: str, device: str) -> None:
    if device == "cpu":
        return
    if importlib.util.find_spec("torch") is None:
        raise ConfigError(key, f"device {device!r} needs torch, which is not installed")
    import torch

    try:
        wanted = torch.device(device)
    except RuntimeError as error:
        raise ConfigError(key, f"{device!r} is not a torch device: {error}") from None
    if wanted.type == "cuda":
        count = torch.cuda.device_count()
        index = wanted.index or 0
        if index >= count:
            raise ConfigError(
                key, f"device {device!r} does not exist (this machine has {count} CUDA devices)"
            )
    elif wanted.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(key, f"device {device!r} is not available here")


def check_environment(config: RunConfig, *, devices: bool = True) -> None:
    """What can be checked without starting anything (see the module's docstring)."""
    from rlrun.env_server.envs.registry import resolve
    from rlrun.env_server.sdk.environment import Environment
    from rlrun.orchestrator.credit.algorithms import builtin

    model = config.model
    if model.path is not None:
        _check_file("model.path", model.path)
        _check_file("model.path", model.path / "config.json")
    else:
        _check_file("model.config", model.config)
    _check_file("model.tokenizer", model.tokenizer)
    orch = config.orchestrator
    for i, env in enumerate(orch.train.env):
        if env.address:
            continue  # an external env-server: its envs are its own
        key = f"orchestrator.train.env.{i}"
        try:
            cls = resolve(env.id)
        except ValueError as error:
            raise ConfigError(f"{key}.id", str(error)) from None
        try:
            inspect.signature(cls).bind(**env.args)
        except TypeError as error:
            raise ConfigError(f"{key}.args", f"env {env.id!r} does not take these args: {error}") from None
        if cls.algorithms is Environment.algorithms:
            for name in env.algorithms or orch.algorithms:
                if builtin(name) is None:
                    raise ConfigError(
                        f"{key}.algorithms" if env.algorithms else "orchestrator.algorithms",
                        f"algorithm {name!r} is not builtin and env {env.id!r} owns no algorithms",
                    )
    if devices:
        _check_device("trainer.device", config.trainer.device)
        if config.inference.engine == "torch":
            _check_device("inference.device", config.inference.device)


def check_run(config: RunConfig, *, devices: bool = True) -> None:
    """Every check of this module (`rlrun check-config`)."""
    check_algorithms(config.orchestrator)
    check_environment(config, devices=devices)
