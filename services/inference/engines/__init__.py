"""Engine registry (`rlrun.common.registry`): one module per engine, imported only when
configured (vLLM is a GPU extra); each engine is its module's `create_engine(config)`. The run
file names the engine (`inference.engine`)."""

from __future__ import annotations

from collections.abc import Callable

from rlrun.common.config import RunConfig
from rlrun.common.registry import Registry
from rlrun.inference.engines.base import Engine

ENGINES: Registry[Callable[[RunConfig], Engine]] = Registry("engine", "rlrun.engines")
ENGINES.register_path("torch", "rlrun.inference.engines.torch_engine:create_engine")
ENGINES.register_path("vllm", "rlrun.inference.engines.vllm_engine:create_engine")


def create_engine(config: RunConfig) -> Engine:
    """The engine `config.inference.engine` names."""
    return ENGINES[config.inference.engine](config)
