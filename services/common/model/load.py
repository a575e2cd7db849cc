"""Model construction: a tiny model from a transformers config JSON with seeded random
init, or a Hugging Face checkpoint from a local directory (never a hub download)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlrun.common.config.model import ModelConfig
from rlrun.common.config.trainer import LoraConfig
from rlrun.common.model.arch import ArchConfig
from rlrun.common.model.families import create_model
from rlrun.common.model.lora import apply_lora
from rlrun.common.model.transformer import CausalLM
from rlrun.common.tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_checkpoint_dir(path: str | Path) -> CausalLM:
    """Loads config.json and every *.safetensors file of a local HF checkpoint directory."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a checkpoint directory: config.json is missing")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{path} holds no *.safetensors weights")
    model = create_model(ArchConfig.from_file(path / "config.json"))
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    state = model.normalize_checkpoint_names(state)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (model.config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match its config: missing {missing}, unexpected {unexpected}"
        )
    return model


def save_checkpoint_dir(model: CausalLM, arch_dict: dict, path: str | Path) -> Path:
    """Writes an HF-layout checkpoint (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(arch_dict, indent=2))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(path / "model.safetensors"))
    return path


def build_model(
    cfg: ModelConfig, device: str | torch.device = "cpu", lora: LoraConfig | None = None
) -> CausalLM:
    """The model a service runs: the checkpoint at `cfg.path`, else a seeded random init;
    with `lora` (`trainer.lora`), its adapters, drawn from `cfg.seed` so that the trainer and
    every replica build the same."""
    if cfg.path is not None:
        model = load_checkpoint_dir(cfg.path)
    else:
        if not Path(cfg.config).exists():
            raise FileNotFoundError(f"model.config {cfg.config} does not exist")
        model = create_model(ArchConfig.from_file(cfg.config))
        model.init_weights(cfg.seed, cfg.init)
    if cfg.tokenizer is not None:
        tokens = load_tokenizer(cfg.tokenizer).vocab_size
        if tokens > model.config.vocab_size:
            raise ValueError(
                f"model.tokenizer {cfg.tokenizer} has {tokens} tokens but the model's vocab_size is {model.config.vocab_size}"
            )
    positions = model.config.max_position_embeddings
    if model.learned_positions and cfg.max_model_len > positions:
        raise ValueError(
            f"model.max_model_len {cfg.max_model_len} exceeds the model's {positions} learned positions (n_positions)"
        )
    if lora is not None:
        apply_lora(model, lora, cfg.seed)
    return model.to(device=device, dtype=DTYPES[cfg.dtype])


def arch_dict(cfg: ModelConfig) -> dict:
    """The transformers config dict of the configured model."""
    source = Path(cfg.path) / "config.json" if cfg.path is not None else Path(cfg.config)
    return json.loads(source.read_text())
