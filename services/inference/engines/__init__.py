"""Engine registry: one module per engine, imported only when configured (vLLM is a GPU extra)."""

from __future__ import annotations

import importlib

from rlrun.common.config import RunConfig
from rlrun.inference.engines.base import Engine

ENGINE_MODULES = {
    "torch": "rlrun.inference.engines.torch_engine",
    "vllm": "rlrun.inference.engines.vllm_engine",
}


def create_engine(config: RunConfig) -> Engine:
    """The engine `config.inference.engine` names; each module exposes `create_engine(config)`."""
    module = importlib.import_module(ENGINE_MODULES[config.inference.engine])
    return module.create_engine(config)
