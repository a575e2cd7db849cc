"""One set of checks of a run file, run before anything starts by every entry point: `rlrun
local`, `rlrun eval`, `rlrun check-config`, `rlrun serve <service>` and the operator's render.
Each finding is a ConfigError naming the key at fault (and, for a misspelt name, the nearest
valid one); all findings are reported together.

What is checked, by the service that would fail without it (a `Scope` says which services an
entry point starts and whether this machine is where they run):
- every service (on this machine): the model and tokenizer files exist;
- orchestrator: every algorithm id the run uses is builtin (its `algorithm_args` table
  validates) or may be owned by an env; a table for an algorithm the run does not use is an
  error;
- the user's file as written: external env entries (with `address`) carry none of the keys
  that configure an env-server rlrun starts;
- env-server: the env ids of the env-servers rlrun starts resolve, their `args` bind to the
  env's constructor, and (on this machine) the env builds (a dataset env reads its file, so a
  column its templates name that the file lacks is found here), an algorithm id the run asks
  of it is builtin or its own, and the tokenizer encodes every prompt (and system message) of
  the first `PROMPT_CHECK_TASKS` tasks of each split;
- inference: `inference.tool_call_parser` names a tool-call parser (or `auto`);
- inference and trainer (on this machine): every `trainer.lora.target_modules` pattern
  matches a linear layer of the model;
- inference and trainer: the configured torch devices exist, and the ports the config sets
  (`inference.http_port`, `trainer.broadcast.nccl_port`) are free;
- trainer: where the entry point decides its ranks (`rlrun local`: one process; the operator:
  its spec's), `trainer.context_parallel` divides them.

`rlrun serve` binds its own ports (`--port`, `--metrics-port`, `--http-port`) before anything
else and says which one is taken, so its scope leaves ports out. The operator's render runs
where the pods do not: it checks what the file alone says (algorithms, external envs, the
built-in env ids and their args).

This module is outside the service packages on purpose: it reads the orchestrator's algorithm
registry and the env-server's env registry, which no service may import from another.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlrun.common.config import ConfigError, RunConfig
from rlrun.common.config.env import EnvConfig, check_external_envs
from rlrun.common.config.orchestrator import OrchestratorConfig
from rlrun.common.errors import describe_validation_error, did_you_mean
from rlrun.common.ports import why_unbindable

SERVICES = frozenset({"inference", "env-server", "orchestrator", "trainer"})
PROMPT_CHECK_TASKS = 5000
"""Tasks of each split whose prompts are checked against the tokenizer (the first ones: a
generated taskset may hold a million, drawn on demand)."""


@dataclass(frozen=True)
class Scope:
    """What an entry point checks: the services it starts (or `rlrun serve` is), and how much of
    the machine it may look at."""

    services: frozenset[str] = SERVICES
    env_keys: frozenset[str] | None = None
    """The env entries an env-server hosts (None: every entry without an `address`)."""
    machine: bool = True
    """The services run here: files, devices and ports are this machine's, and envs can be built."""
    devices: bool = True
    ports: bool = True
    as_written: bool = True
    """The user's file as written (no launcher or operator has filled in the env addresses)."""
    trainer_ranks: int | None = 1
    """The trainer's world size where the entry point decides it (`rlrun local` starts one
    process); None where torchrun does (`rlrun serve trainer` checks it as it starts)."""

    @classmethod
    def service(cls, name: str, env_keys: list[str] | None = None) -> Scope:
        """`rlrun serve <name>`: its own part; it binds its ports itself, first."""
        return cls(
            services=frozenset({name}),
            env_keys=frozenset(env_keys) if env_keys else None,
            ports=False,
            as_written=False,
            trainer_ranks=None,
        )

    @classmethod
    def cluster(cls, trainer_ranks: int | None = None) -> Scope:
        """The operator: the file alone (the pods run elsewhere, with their own images), and
        the trainer's ranks its spec starts."""
        return cls(machine=False, devices=False, ports=False, trainer_ranks=trainer_ranks)


@dataclass
class Findings:
    errors: list[ConfigError] = field(default_factory=list)

    def check(self, run: Callable[..., Any], *args: Any) -> Any:
        """Runs one check, `run(*args)`; a ConfigError it raises is a finding, and None is
        returned."""
        try:
            return run(*args)
        except ConfigError as error:
            self.errors.append(error)
            return None

    def raise_any(self) -> None:
        if not self.errors:
            return
        first, rest = self.errors[0], self.errors[1:]
        message = first.message + "".join(f"\n  and {e}" for e in rest)
        raise ConfigError(first.path, message)


# -- algorithms -------------------------------------------------------------------------------


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


def _algorithm_checks(orch: OrchestratorConfig, findings: Findings) -> None:
    """Builtin ids' args validate; tables of algorithms the run does not use are errors."""
    from rlrun.orchestrator.credit.algorithms import builtin

    used = used_algorithms(orch)
    for name in orch.algorithm_args:
        if name not in used:
            findings.check(_unused_table, name, used)
    for name in used:
        cls = builtin(name)
        if cls is not None:  # else an env's own algorithm: the env checks check what they can
            findings.check(_algorithm_args, name, cls, orch.algorithm_args.get(name, {}))


def _unused_table(name: str, used: dict[str, str]) -> None:
    from rlrun.orchestrator.credit.algorithms import builtin_names

    hint = did_you_mean(name, used) or did_you_mean(name, builtin_names())
    raise ConfigError(
        f"orchestrator.algorithm_args.{name}",
        f"a table for algorithm {name!r}, which the run does not use{hint} "
        f"(it uses: {', '.join(sorted(used))}); remove the table or add {name!r} to the algorithms",
    )


def _algorithm_args(name: str, cls: Any, args: dict[str, Any]) -> None:
    try:
        cls.Args.model_validate(args)
    except ValueError as error:
        raise ConfigError(
            f"orchestrator.algorithm_args.{name}", describe_validation_error(error, cls.Args)
        ) from None


# -- inference --------------------------------------------------------------------------------


def _tool_call_parser(name: str, machine: bool) -> None:
    """`inference.tool_call_parser` is `auto`, a registered parser, or (where the service runs
    here, so that its import can be tried) an import path of one."""
    from rlrun.inference.openai.tool_parsers import AUTO, PARSERS

    if name == AUTO or name in PARSERS or (not machine and ":" in name):
        return
    try:
        PARSERS.resolve(name)
    except ValueError as error:
        raise ConfigError("inference.tool_call_parser", f"{error} (or `{AUTO}`)") from None


# -- files, devices, ports --------------------------------------------------------------------


def _check_file(key: str, path: Path | None) -> None:
    if path is not None and not Path(path).exists():
        raise ConfigError(key, f"{path} does not exist")


def _model_files(config: RunConfig, findings: Findings) -> None:
    model = config.model
    if model.path is not None:
        findings.check(_check_file, "model.path", model.path)
        findings.check(_check_file, "model.path", model.path / "config.json")
    else:
        findings.check(_check_file, "model.config", model.config)
    findings.check(_check_file, "model.tokenizer", model.tokenizer)


def _lora_targets(config: RunConfig) -> None:
    """Every `trainer.lora.target_modules` pattern matches a linear layer of the model (and
    the tied-head rule holds), read from the module tree of its config.json, built on the
    meta device (no weights). Where torch is missing, nothing here builds the model."""
    lora, model = config.trainer.lora, config.model
    if lora is None or (model.hub_id is not None and model.path is None):
        return  # no LoRA, or a Hub model not downloaded yet (its config.json is not here)
    source = model.path / "config.json" if model.path is not None else model.config
    if source is None or not Path(source).exists():
        return  # a finding of its own
    if importlib.util.find_spec("torch") is None:
        return
    import torch

    from rlrun.common.model import ArchConfig, create_model
    from rlrun.common.model.lora import lora_targets

    with torch.device("meta"):
        tree = create_model(ArchConfig.from_file(source))
    lora_targets(tree, lora)


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
                key,
                f"device {device!r} does not exist (this machine has {count} CUDA devices); "
                f'set {key} = "cpu"' + (", or run where a GPU is" if not count else ""),
            )
    elif wanted.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(key, f"device {device!r} is not available here")


def check_port(key: str, host: str, port: int) -> None:
    problem = why_unbindable(host, port)
    if problem is not None:
        raise ConfigError(
            key,
            f"port {port} on {host} is taken ({problem}): stop what holds it (`ss -ltnp 'sport = :{port}'` "
            f"names it) or set {key} to another port",
        )


def _ports(config: RunConfig, services: frozenset[str], findings: Findings) -> None:
    if "inference" in services and config.inference.http_port:
        findings.check(check_port, "inference.http_port", "127.0.0.1", config.inference.http_port)
    broadcast = config.trainer.broadcast
    nccl = broadcast.transport == "nccl" or (
        broadcast.transport == "auto" and config.trainer.device.startswith("cuda")
    )
    if "trainer" in services and broadcast.nccl_port and nccl:
        findings.check(check_port, "trainer.broadcast.nccl_port", "127.0.0.1", broadcast.nccl_port)


# -- environments -----------------------------------------------------------------------------


def env_entries(config: RunConfig, keys: frozenset[str] | None) -> list[tuple[str, EnvConfig]]:
    """(key path, entry) of every env entry an env-server rlrun starts hosts (or of `keys`)."""
    orch = config.orchestrator
    entries = [(f"orchestrator.train.env.{i}", env) for i, env in enumerate(orch.train.env)]
    entries += [(f"orchestrator.eval.env.{i}", env) for i, env in enumerate(orch.eval.env)]
    if keys is not None:
        return [(path, env) for path, env in entries if env.key in keys]
    return [(path, env) for path, env in entries if not env.address]


def _env_class(key: str, env: EnvConfig, machine: bool) -> Any:
    """The entry's Environment class; None when it cannot be known here (an import path the
    operator's image need not hold, or verifiers where it is not installed)."""
    from rlrun.env_server.envs import registry

    if not machine and ":" in env.id:
        return None  # an import path or `vf:<name>`: the env-server image's packages
    try:
        return registry.resolve(env.id)
    except ValueError as error:
        raise ConfigError(f"{key}.id", str(error)) from None


def _bind_args(key: str, env: EnvConfig, cls: Any) -> None:
    from rlrun.env_server.envs import registry

    args = registry.env_args(env.id, env.args)
    signature = inspect.signature(cls)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    known = [name for name in signature.parameters if name not in ("self", "env_name")]
    for name in env.args:
        if not takes_any and name not in signature.parameters:
            raise ConfigError(
                f"{key}.args.{name}",
                f"env {env.id!r} takes no argument {name!r}{did_you_mean(name, known)} "
                f"(its arguments: {', '.join(known) or 'none'})",
            )
    try:
        signature.bind(**args)
    except TypeError as error:
        raise ConfigError(f"{key}.args", f"env {env.id!r} does not take these args: {error}") from None


def _build(key: str, env: EnvConfig) -> Any:
    from rlrun.env_server.envs.registry import make_env
    from rlrun.env_server.runtimes.registry import RuntimeOptionError

    harness = env.harness.model_dump() if env.harness is not None else None
    runtime = env.runtime.model_dump() if env.runtime is not None else None
    try:
        return make_env(env.id, env.args, harness, runtime)
    except RuntimeOptionError as error:
        raise ConfigError(f"{key}.runtime.{error.field}", error.message) from None
    except Exception as error:  # the env's own constructor: any of its errors is the entry's
        message = str(error).removeprefix(f"environment {env.id!r}: ")
        raise ConfigError(f"{key}.args", f"env {env.id!r} cannot be built: {message}") from None


def _check_owned_algorithms(key: str, env: EnvConfig, instance: Any, orch: OrchestratorConfig) -> None:
    from rlrun.orchestrator.credit.algorithms import builtin, builtin_names

    owned = instance.algorithms()
    for name in env.algorithms or orch.algorithms:
        if builtin(name) is None and name not in owned:
            where = f"{key}.algorithms" if env.algorithms else "orchestrator.algorithms"
            choices = [*builtin_names(), *owned]
            raise ConfigError(
                where,
                f"algorithm {name!r} is not builtin{did_you_mean(name, choices)} and env {env.id!r} "
                + (f"owns only {', '.join(sorted(owned))}" if owned else "owns no algorithms"),
            )


def _prompts(instance: Any) -> Iterator[tuple[str, int, str]]:
    """(split, index, text) of the prompts and system messages the prompt check reads."""
    taskset = instance.taskset
    for split, size in taskset.sizes.items():
        for idx in range(min(size, PROMPT_CHECK_TASKS)):
            task = taskset.get(split, idx)
            members = instance.members or (None,)
            for member in members:
                prompt, system = (
                    instance.member_prompt(task, member) if member else (task.prompt, task.system)
                )
                yield split, idx, prompt
                if system:
                    yield split, idx, system


def _check_prompts(key: str, env: EnvConfig, instance: Any, tokenizer: Any, config: RunConfig) -> None:
    for split, idx, text in _prompts(instance):
        unknown = tokenizer.unknown(text)
        if unknown:
            which = config.model.tokenizer or config.model.path
            raise ConfigError(
                key,
                f"env {env.key!r}: the prompt of {split} task {idx} ({text[:60]!r}) holds characters "
                f"the tokenizer {which} cannot encode: {unknown!r}; change the prompts, or use a "
                "tokenizer that has them (model.tokenizer)",
            )


def _env_checks(config: RunConfig, scope: Scope, findings: Findings) -> None:
    tokenizer = findings.check(_load_tokenizer, config) if scope.machine else None
    for key, env in env_entries(config, scope.env_keys):
        before = len(findings.errors)
        cls = findings.check(_env_class, key, env, scope.machine)
        if cls is None:
            continue
        findings.check(_bind_args, key, env, cls)
        if not scope.machine or len(findings.errors) > before:
            continue
        instance = findings.check(_build, key, env)
        if instance is None:
            continue
        if key.startswith("orchestrator.train."):
            findings.check(_check_owned_algorithms, key, env, instance, config.orchestrator)
        if tokenizer is not None:
            findings.check(_check_prompts, key, env, instance, tokenizer, config)


def _load_tokenizer(config: RunConfig) -> Any:
    from rlrun.common.tokenizer import load_tokenizer

    model = config.model
    if (model.tokenizer is not None and not Path(model.tokenizer).exists()) or (
        model.tokenizer is None and (model.path is None or not Path(model.path).exists())
    ):
        return None  # the file checks name it
    try:
        return load_tokenizer(model.tokenizer, model.path)
    except (OSError, ValueError) as error:
        raise ConfigError("model.tokenizer", f"cannot load the tokenizer: {error}") from None


# -- the whole set ----------------------------------------------------------------------------


def _machine_checks(config: RunConfig, scope: Scope, findings: Findings) -> None:
    services = scope.services
    if scope.machine:
        _model_files(config, findings)
        if services & {"trainer", "inference"}:
            findings.check(_lora_targets, config)
    if services & {"env-server"}:
        _env_checks(config, scope, findings)
    if scope.machine and scope.devices:
        if "trainer" in services:
            findings.check(_check_device, "trainer.device", config.trainer.device)
        if "inference" in services and config.inference.engine == "torch":
            findings.check(_check_device, "inference.device", config.inference.device)
    if scope.machine and scope.ports:
        _ports(config, services, findings)


def _context_groups(size: int, ranks: int) -> None:
    if ranks % size:
        raise ConfigError(
            "trainer.context_parallel",
            f"context groups of {size} ranks do not divide the trainer's {ranks} rank(s) here "
            "(`rlrun local` runs one trainer process; context parallelism runs under torchrun: "
            "`rlrun serve trainer`, or the operator's spec.trainer nodes x gpus_per_node)",
        )


def check_run(config: RunConfig, scope: Scope | None = None, *, devices: bool = True) -> None:
    """Every check `scope` covers (default: the whole run on this machine); raises one
    ConfigError naming every finding."""
    scope = scope or Scope(devices=devices)
    findings = Findings()
    if "orchestrator" in scope.services:
        _algorithm_checks(config.orchestrator, findings)
    if "inference" in scope.services:
        findings.check(_tool_call_parser, config.inference.tool_call_parser, scope.machine)
    if "trainer" in scope.services and scope.trainer_ranks is not None:
        findings.check(_context_groups, config.trainer.context_parallel, scope.trainer_ranks)
    if scope.as_written:
        orch = config.orchestrator
        findings.check(check_external_envs, orch.train.env, "orchestrator.train.env")
        findings.check(check_external_envs, orch.eval.env, "orchestrator.eval.env")
    _machine_checks(config, scope, findings)
    findings.raise_any()
