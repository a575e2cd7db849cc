"""Configuration of a run: pydantic models for the whole TOML file, one module per section."""

from rlrun.common.config.deprecations import ConfigError, translate_deprecated
from rlrun.common.config.env import EnvConfig, PoolConfig
from rlrun.common.config.grpc import GrpcConfig, TlsConfig
from rlrun.common.config.inference import InferenceConfig
from rlrun.common.config.model import ModelConfig
from rlrun.common.config.orchestrator import (
    POLICY,
    EvalConfig,
    FiltersConfig,
    MemberConfig,
    ModelTargetConfig,
    OrchestratorConfig,
    WarmStartConfig,
)
from rlrun.common.config.run import (
    RunConfig,
    load_config,
    load_config_with_warnings,
    reload_config,
    resolve_config,
)
from rlrun.common.config.sampling import SamplingConfig, SamplingOverrides
from rlrun.common.config.trainer import LoraConfig, TrainerConfig

__all__ = [
    "POLICY",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "FiltersConfig",
    "GrpcConfig",
    "InferenceConfig",
    "LoraConfig",
    "MemberConfig",
    "ModelConfig",
    "ModelTargetConfig",
    "OrchestratorConfig",
    "PoolConfig",
    "RunConfig",
    "SamplingConfig",
    "SamplingOverrides",
    "TlsConfig",
    "TrainerConfig",
    "WarmStartConfig",
    "load_config",
    "load_config_with_warnings",
    "reload_config",
    "resolve_config",
    "translate_deprecated",
]
