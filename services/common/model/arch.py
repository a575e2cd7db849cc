"""Architecture settings read from a transformers config.json (Llama or Qwen3)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED = ("llama", "qwen3", "qwen2", "mistral")


@dataclass(frozen=True)
class ArchConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    max_position_embeddings: int
    initializer_range: float

    @classmethod
    def from_dict(cls, cfg: dict) -> ArchConfig:
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED:
            raise ValueError(f"model_type {model_type!r} is not supported; expected one of {SUPPORTED}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported; expected silu")
        scaling = cfg.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope_scaling {scaling} is not supported; only default RoPE is")
        heads = cfg["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", 10000.0),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", model_type == "qwen2"),
            qk_norm=model_type == "qwen3",
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            initializer_range=cfg.get("initializer_range", 0.02),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ArchConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
