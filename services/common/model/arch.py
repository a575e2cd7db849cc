"""Architecture settings read from a transformers config.json.

Two families: `llama` (Llama, Qwen2, Qwen3, Mistral: RMSNorm, rotary positions, SwiGLU) and
`gpt2` (GPT-2: LayerNorm, learned absolute positions, GELU MLP, biases everywhere).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LLAMA_TYPES = ("llama", "qwen3", "qwen2", "mistral")
GPT2_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh")
SUPPORTED = (*LLAMA_TYPES, "gpt2")


@dataclass(frozen=True)
class ArchConfig:
    model_type: str
    family: str
    """`llama` or `gpt2`: which module tree (and parameter names) the model has."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    activation: str
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int
    initializer_range: float
    rope_theta: float = 10000.0
    qk_norm: bool = False

    @classmethod
    def from_dict(cls, cfg: dict) -> ArchConfig:
        model_type = cfg.get("model_type")
        if model_type in LLAMA_TYPES:
            return cls._llama(cfg)
        if model_type == "gpt2":
            return cls._gpt2(cfg)
        raise ValueError(f"model_type {model_type!r} is not supported; expected one of {SUPPORTED}")

    @classmethod
    def _llama(cls, cfg: dict) -> ArchConfig:
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported; expected silu")
        scaling = cfg.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope_scaling {scaling} is not supported; only default RoPE is")
        heads = cfg["num_attention_heads"]
        model_type = cfg["model_type"]
        return cls(
            model_type=model_type,
            family="llama",
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            activation="silu",
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", model_type == "qwen2"),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            initializer_range=cfg.get("initializer_range", 0.02),
            rope_theta=cfg.get("rope_theta", 10000.0),
            qk_norm=model_type == "qwen3",
        )

    @classmethod
    def _gpt2(cls, cfg: dict) -> ArchConfig:
        activation = cfg.get("activation_function", "gelu_new")
        if activation not in GPT2_ACTIVATIONS:
            raise ValueError(
                f"activation_function {activation!r} is not supported; expected one of {GPT2_ACTIVATIONS}"
            )
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if cfg.get(flag):
                raise ValueError(f"{flag} is not supported")
        if cfg.get("add_cross_attention"):
            raise ValueError("add_cross_attention is not supported: rlrun models are decoder-only")
        hidden, heads = cfg.get("n_embd", 768), cfg.get("n_head", 12)
        if hidden % heads:
            raise ValueError(f"n_embd {hidden} is not divisible by n_head {heads}")
        # Dropout settings are read by nobody: RL needs the policy that sampled a token and
        # the policy that trains on it to be the same function, so no dropout is ever applied.
        return cls(
            model_type="gpt2",
            family="gpt2",
            vocab_size=cfg.get("vocab_size", 50257),
            hidden_size=hidden,
            intermediate_size=cfg.get("n_inner") or 4 * hidden,
            num_layers=cfg.get("n_layer", 12),
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=hidden // heads,
            norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
            activation=activation,
            tie_word_embeddings=cfg.get("tie_word_embeddings", True),
            attention_bias=True,
            max_position_embeddings=cfg.get("n_positions", 1024),
            initializer_range=cfg.get("initializer_range", 0.02),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ArchConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
