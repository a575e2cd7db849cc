"""[model]: which model every service builds, and its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rlrun.common.config.base import Section

CHAR_TOKENIZER = Path("configs/tokenizer/char")
HUB_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"
"""A Hub repository id: `name` or `org/name`."""
"""The tokenizer of a model built from `config` when none is named."""


class ModelConfig(Section):
    config: Path | None = Path("configs/models/tiny-d64.json")
    """A transformers config JSON (Llama, Qwen2/3, Mistral or GPT-2) for a model built locally
    with random init.
    Ignored when `path` or `hub_id` is set. Default: configs/models/tiny-d64.json."""

    path: Path | None = None
    """A local Hugging Face checkpoint directory (config.json + *.safetensors). Default: unset."""

    hub_id: str | None = Field(None, pattern=HUB_ID)
    """A Hugging Face Hub model id (`Qwen/Qwen3-0.6B`) instead of `path`: before the services
    start, `rlrun local` (and each `rlrun serve`) downloads it into the standard Hugging Face
    cache (HF_HOME, once: a cached snapshot is reused, HF_HUB_OFFLINE=1 never reaches the Hub)
    and loads it from there, as from `path`. In the cluster, name it in the RLRun's
    spec.model.huggingFace instead (one download per run into a volume every pod mounts).
    Default: unset."""

    hub_revision: str | None = None
    """The branch, tag or commit of `hub_id`. Default: main."""

    tokenizer: Path | None = None
    """A tokenizer folder in Hugging Face's format (tokenizer.json + tokenizer_config.json): the
    character tokenizers configs/tokenizer/char and lowercase, or any other. Default: the
    checkpoint's own tokenizer when `path` or `hub_id` is set, else configs/tokenizer/char."""

    seed: int = 0
    """Seed for random initialisation. Default: 0."""

    init: Literal["transformers", "pytorch"] = "transformers"
    """Random-init scheme when `config` is used: `transformers` draws every weight from
    normal(0, initializer_range) as transformers does; `pytorch` keeps PyTorch's module defaults
    (embeddings normal(0, 1), linear layers uniform(+-1/sqrt(fan_in))), with which the tiny
    from-scratch demo models learn faster under RL. Default: transformers."""

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype. Default: float32."""

    max_model_len: int = Field(64, gt=1)
    """Context length in tokens (prompt + completion). Default: 64."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.path is not None and self.hub_id is not None:
            raise ValueError("set model.path (a local checkpoint) or model.hub_id (a Hub model), not both")
        if self.hub_revision is not None and self.hub_id is None:
            raise ValueError("model.hub_revision needs model.hub_id")
        if self.config is None and self.path is None and self.hub_id is None:
            raise ValueError("set model.config (random init), model.path or model.hub_id (checkpoint)")
        if self.tokenizer is None and self.path is None and self.hub_id is None:
            self.tokenizer = CHAR_TOKENIZER
        return self
