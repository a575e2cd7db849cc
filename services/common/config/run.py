"""The whole run file: every service reads its own section of it."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError, model_validator

from rlrun.common.config.base import Section
from rlrun.common.config.deprecations import ConfigError, translate_deprecated
from rlrun.common.config.grpc import GrpcConfig
from rlrun.common.config.inference import InferenceConfig
from rlrun.common.config.limits import LimitsConfig, RequestLimits, resolve_limits
from rlrun.common.config.model import ModelConfig
from rlrun.common.config.monitor import MonitorConfig
from rlrun.common.config.orchestrator import OrchestratorConfig
from rlrun.common.config.trainer import TrainerConfig
from rlrun.common.errors import describe_error_item

log = logging.getLogger(__name__)


class RunConfig(Section):
    name: str = "run"
    """Run name (output folder, labels, metrics). Default: run."""

    output_dir: Path | None = None
    """Folder for logs, metrics, eval results, checkpoints and plots. Default: outputs/<name>."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of every service. Default: INFO."""

    model: ModelConfig = ModelConfig()
    """The model and tokenizer."""

    inference: InferenceConfig = InferenceConfig()
    """The inference service."""

    trainer: TrainerConfig = TrainerConfig()
    """The trainer service."""

    orchestrator: OrchestratorConfig
    """The orchestrator: tasks, environments, algorithms."""

    grpc: GrpcConfig = GrpcConfig()
    """Transport settings shared by all services."""

    monitor: MonitorConfig = MonitorConfig()
    """Experiment tracking (Weights & Biases, TensorBoard); off by default."""

    limits: LimitsConfig = LimitsConfig()
    """The most work one request may ask of a service; derived from the rest of the file
    unless set."""

    @model_validator(mode="after")
    def _cross_sections(self) -> RunConfig:
        if self.trainer.broadcast.transport == "ipc" and self.inference.engine != "torch":
            raise ValueError(
                f"trainer.broadcast.transport = 'ipc' needs inference.engine = 'torch', not "
                f"{self.inference.engine!r} (use 'nccl' or 'auto')"
            )
        if self.trainer.lora is not None and self.inference.engine != "torch":
            raise ValueError(
                f"trainer.lora needs inference.engine = 'torch', not {self.inference.engine!r}: "
                "only the torch engine serves the adapters (vLLM's LoRA support is not wired in)"
            )
        longest = max(
            [self.orchestrator.train.sampling.max_completion_tokens]
            + [e.sampling.max_completion_tokens or 0 for e in self.orchestrator.train.env]
        )
        if longest >= self.model.max_model_len:
            raise ValueError(
                f"orchestrator.train.sampling.max_completion_tokens ({longest}) must be below "
                f"model.max_model_len ({self.model.max_model_len})"
            )
        samples = self.limits.max_samples
        if samples is not None and samples > self.inference.max_waiting:
            raise ValueError(
                f"limits.max_samples ({samples}) must be at most inference.max_waiting "
                f"({self.inference.max_waiting}): the queue could never hold such a request"
            )
        return self

    def request_limits(self) -> RequestLimits:
        """The limits, each unset one derived from the rest of the file (config/limits.py)."""
        return resolve_limits(self)

    @property
    def run_dir(self) -> Path:
        return self.output_dir if self.output_dir is not None else Path("outputs") / self.name


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value); the value is read as TOML, else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError("", f"override {text!r} is not KEY=VALUE (e.g. orchestrator.max_steps=10)")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip().split("."), parsed


def apply_override(raw: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = raw
    for i, part in enumerate(path[:-1]):
        where = ".".join(path[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(where, f"no list entry {part} (the list has {len(node)})")
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise ConfigError(where, "is not a table")
    last = path[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(".".join(path), f"no list entry {last}")
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(".".join(path[:-1]), "is not a table")


def _format_validation_error(error: ValidationError) -> ConfigError:
    """The first error, its key path and (for an unknown key) the nearest valid key; the
    others are named after it."""
    items = [describe_error_item(item, RunConfig) for item in error.errors()]
    (path, message), rest = items[0], items[1:]
    if rest:
        message += f" (and {len(rest)} more: " + "; ".join(f"{p}: {m}" for p, m in rest) + ")"
    return ConfigError("" if path == "<root>" else path, message)


def resolve_config(raw: dict[str, Any], overrides: list[str] = ()) -> tuple[RunConfig, list[str]]:
    """Validates a raw run table; returns the config and the deprecation warnings."""
    warnings = translate_deprecated(raw)
    for text in overrides:
        path, value = parse_override(text)
        apply_override(raw, path, value)
    try:
        return RunConfig.model_validate(raw), warnings
    except ValidationError as error:
        raise _format_validation_error(error) from None


def load_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Reads a run file, translates deprecated keys (one logged warning each), applies
    `--set` overrides and validates. Raises ConfigError naming the key path at fault."""
    config, warnings = load_config_with_warnings(path, overrides)
    for warning in warnings:
        log.warning("%s: %s", path, warning)
    return config


def load_config_with_warnings(path: str | Path, overrides: list[str] = ()) -> tuple[RunConfig, list[str]]:
    """As load_config, but the deprecation warnings are returned, not logged: the caller shows
    each one once (the CLI prints them; logging them here too printed every one twice)."""
    return _read(Path(path), overrides)


def reload_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Reads the run file again, for a running service that follows changes to it (its
    deprecation warnings were logged at start)."""
    return _read(Path(path), overrides)[0]


def _read(path: Path, overrides: list[str]) -> tuple[RunConfig, list[str]]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("", f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("", f"{path} is not valid TOML: {error}") from None
    return resolve_config(raw, overrides)
