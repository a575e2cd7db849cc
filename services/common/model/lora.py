"""LoRA (Hu et al., 2021): a frozen linear layer plus a trained low-rank update,
y = W x + b + (alpha / r) · B A dropout(x), with A [r, in] and B [out, r].

`apply_lora` wraps the layers `trainer.lora.target_modules` names, freezes everything else
(but the embeddings or the head when asked) and records on the model what trains
(`CausalLM.trained`), which is what a weight update carries and a checkpoint keeps. B starts
at zero, so a wrapped model starts as its base. The trainer and the torch engine build the
same wrapped model from the same config; the engine runs the adapters unmerged, as the
trainer does, so an update is the adapters alone and both compute one function.

Names are Hugging Face's with PEFT's adapter suffixes (`<layer>.lora_A.weight`,
`<layer>.lora_B.weight`): a wrapped layer keeps its own `weight` and `bias` under their
names, so the base still loads from and saves to the HF layout. `peft_state` and
`peft_config` turn the trained tensors into the files of a PEFT adapter
(`adapter_model.safetensors`, `adapter_config.json`); `from_peft_state` reads them back.
"""

from __future__ import annotations

import fnmatch
import math

import torch
import torch.nn.functional as F
from torch import nn

from rlrun.common.config.deprecations import ConfigError
from rlrun.common.config.model import ModelConfig
from rlrun.common.config.trainer import ALL_LINEAR, LoraConfig
from rlrun.common.model.transformer import CausalLM, Conv1D, conv1d

PEFT_PREFIX = "base_model.model."
"""What PEFT's saved adapter puts before the base model's own module names."""


class LoraLinear(nn.Module):
    """`base` (an nn.Linear, or GPT-2's Conv1D with its [in, out] weight) with a low-rank
    update. The base's parameters move here under their own names, unchanged."""

    def __init__(self, base: nn.Linear | Conv1D, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.fan_in_fan_out = isinstance(base, Conv1D)
        """PEFT's name for a base weight stored [in, out]."""
        out_features, in_features = base.weight.shape[::-1] if self.fan_in_fan_out else base.weight.shape
        self.weight = base.weight
        self.bias = base.bias
        like = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(in_features, rank, bias=False, **like)
        self.lora_B = nn.Linear(rank, out_features, bias=False, **like)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scaling = alpha / rank

    def reset_adapter(self, generator: torch.Generator) -> None:
        """A as PEFT draws it (kaiming-uniform with a = sqrt(5), i.e. uniform(±1/sqrt(in))),
        B zero: the update starts at zero."""
        a = self.lora_A.weight
        bound = 1.0 / math.sqrt(a.shape[1])
        with torch.no_grad():
            a.copy_((torch.rand(a.shape, generator=generator) * 2 - 1) * bound)
            self.lora_B.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fan_in_fan_out:
            base = conv1d(x, self.weight, self.bias)
        else:
            base = F.linear(x, self.weight, self.bias)
        return base + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """The update in the base weight's layout: what merging adds to `weight`."""
        delta = (self.lora_B.weight @ self.lora_A.weight) * self.scaling
        return delta.T if self.fan_in_fan_out else delta


def linear_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Every layer LoRA can wrap, by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear | Conv1D)}


def matches(pattern: str, name: str) -> bool:
    """PEFT's rule for a name in a target list (the whole name, or its last dotted parts),
    plus a glob over the whole name."""
    return name == pattern or name.endswith("." + pattern) or fnmatch.fnmatchcase(name, pattern)


def lora_targets(model: CausalLM, config: LoraConfig) -> list[str]:
    """The qualified names of the layers `config` wraps, in module order. Raises ConfigError
    naming the field: a pattern that matches no linear layer, or a tied head trained apart
    from its embedding. Reads only the module tree (a model on the meta device will do)."""
    layers = linear_layers(model)
    if config.target_modules == ALL_LINEAR:
        inside = {id(m) for m in model.decoder_layers().modules()}
        targets = [name for name, module in layers.items() if id(module) in inside]
    else:
        for pattern in config.target_modules:
            if not any(matches(pattern, name) for name in layers):
                known = sorted({name.rsplit(".", 1)[-1] for name in layers})
                raise ConfigError(
                    "trainer.lora.target_modules",
                    f"pattern {pattern!r} matches no linear layer of the model "
                    f"(its linear layers end in {', '.join(known)})",
                )
        targets = [n for n in layers if any(matches(p, n) for p in config.target_modules)]
    if model.config.tie_word_embeddings and "lm_head" in targets:
        raise ConfigError(
            "trainer.lora.target_modules",
            "lm_head is tied to the token embedding here; an adapter on it is not supported "
            "(train both in full with train_head and train_embeddings)",
        )
    if model.config.tie_word_embeddings and config.train_embeddings != config.train_head:
        raise ConfigError(
            "trainer.lora.train_head",
            "the model ties its head to its token embedding: set train_head and train_embeddings alike",
        )
    return targets


def embedding_modules(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.Embedding)]


def apply_lora(model: CausalLM, config: LoraConfig, seed: int) -> list[str]:
    """Wraps the target layers in place (adapters drawn from `seed`, so that every process
    building the model draws the same), freezes the rest but what `config` trains in full,
    and sets `model.trained`. Returns the wrapped layers' names."""
    targets = lora_targets(model, config)
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        wrapped = LoraLinear(getattr(parent, child), config.rank, config.alpha, config.dropout)
        wrapped.reset_adapter(generator)
        setattr(parent, child, wrapped)
        wrapped.lora_A.requires_grad_(True)
        wrapped.lora_B.requires_grad_(True)
    if config.train_embeddings:
        for name in embedding_modules(model):
            model.get_submodule(name).requires_grad_(True)
    if config.train_head:
        model.lm_head.weight.requires_grad_(True)
    model.trained = frozenset(name for name, p in model.named_parameters() if p.requires_grad)
    return targets


def adapters(model: nn.Module) -> dict[str, LoraLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


def fully_trained_modules(config: LoraConfig, model: CausalLM) -> list[str]:
    """The modules that train in full beside the adapters (PEFT's `modules_to_save`)."""
    names = embedding_modules(model) if config.train_embeddings else []
    if config.train_head and not model.config.tie_word_embeddings:
        names.append("lm_head")
    return names


def base_model_name(model: ModelConfig) -> str:
    """What an adapter names as its base: the Hub id or checkpoint folder (a model of random
    init has none; the run's config rebuilds it)."""
    return model.hub_id or (str(model.path) if model.path is not None else "")


def peft_config(config: LoraConfig, model: CausalLM, base_model: str = "") -> dict:
    """The adapter's `adapter_config.json`: the wrapped layers by qualified name (which
    PEFT's target list matches exactly), the fully trained modules as `modules_to_save`."""
    targets = list(adapters(model))
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": targets,
        "fan_in_fan_out": any(m.fan_in_fan_out for m in adapters(model).values()),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": fully_trained_modules(config, model) or None,
        "inference_mode": True,
    }


def peft_state(trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trained tensors (rlrun names) under PEFT's saved names, `base_model.model.<name>`
    (an adapter's `<layer>.lora_A.weight`, a fully trained module's own tensor names)."""
    return {PEFT_PREFIX + name: tensor for name, tensor in trained.items()}


def from_peft_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`peft_state` undone: the tensors under rlrun's names."""
    for name in state:
        if not name.startswith(PEFT_PREFIX):
            raise ValueError(f"{name} is not a PEFT adapter tensor (no {PEFT_PREFIX!r} prefix)")
    return {name.removeprefix(PEFT_PREFIX): tensor for name, tensor in state.items()}


@torch.no_grad()
def merge_lora(model: CausalLM) -> CausalLM:
    """The wrapped layers folded back into plain ones (W + scaling · B A): the model as a
    Hugging Face checkpoint holds it."""
    for name, wrapped in adapters(model).items():
        parent_name, _, child = name.rpartition(".")
        weight = wrapped.weight
        out_features, in_features = weight.shape[::-1] if wrapped.fan_in_fan_out else weight.shape
        plain: nn.Module
        if wrapped.fan_in_fan_out:
            plain = Conv1D(in_features, out_features)
        else:
            plain = nn.Linear(in_features, out_features, bias=wrapped.bias is not None)
        plain.weight = nn.Parameter(weight + wrapped.delta_weight().to(weight.dtype))
        if wrapped.bias is not None:
            plain.bias = wrapped.bias
        setattr(model.get_submodule(parent_name), child, plain)
    model.trained = None
    return model
