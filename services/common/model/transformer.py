"""What every model family shares: the forward contract, the layer list FSDP shards, the
tied-embedding name, and seeded random initialisation.

Families (`llama.py`, `gpt2.py`) keep Hugging Face's parameter names exactly, so checkpoints
load directly and weight updates are addressed by HF names (as vLLM's loader expects).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from rlrun.common.model.arch import ArchConfig

InitScheme = Literal["transformers", "pytorch"]


class Attend(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight stored [in, out], so HF checkpoints load unchanged."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv1d(x, self.weight, self.bias)


def conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GPT-2's linear map with its [in, out] weight (shared with the LoRA wrapper of a Conv1D)."""
    return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], -1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # HF's order (normalise in float32, cast back, then scale), with the normalisation as
        # one fused op rather than five: norms are four of a Qwen3 layer's few dozen kernels.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


NORMS = (nn.LayerNorm, RMSNorm)


class CausalLM(nn.Module, ABC):
    """forward(input_ids [T], positions [T], attend) -> logits [T, vocab]. Subclasses build
    the module tree and `hidden_states`; `lm_head` maps hidden states to logits."""

    embedding_key: ClassVar[str]
    """The HF name of the token embedding, which a tied lm_head shares."""
    learned_positions: ClassVar[bool] = False
    """Positions are embeddings (bounded by max_position_embeddings), not rotations."""
    residual_projections: ClassVar[tuple[str, ...]] = ()
    """Name suffixes of the layers transformers initialises with std / sqrt(2 * layers)."""

    config: ArchConfig
    lm_head: nn.Linear
    trained: frozenset[str] | None = None
    """The names of the tensors training changes, when not all of them (LoRA: the adapters;
    rlrun.common.model.lora): a weight update carries only these."""

    @abstractmethod
    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The final-norm hidden states [T, hidden] of packed tokens."""

    @abstractmethod
    def decoder_layers(self) -> nn.ModuleList:
        """The repeated blocks (what FSDP shards one by one)."""

    def _add_lm_head(self) -> None:
        """Called by a family once its embedding exists: ties the head to it when configured."""
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.get_parameter(self.embedding_key)

    def normalize_checkpoint_names(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors under this module tree's names (for layouts HF also loads)."""
        return state

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: Attend,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [T, vocab], or only those of `rows` [R] (the rows that predict a trained
        token): the head is the costliest matmul of a large vocabulary, and its [T, vocab]
        output the largest activation, so a trainer skips it for prompt rows. Through
        `forward`, so that FSDP's hooks on the root module gather the head's weights."""
        hidden = self.hidden_states(input_ids, positions, attend)
        return self.lm_head(hidden if rows is None else hidden.index_select(0, rows))

    def init_weights(self, seed: int, scheme: InitScheme = "transformers") -> None:
        """Seeded random init.

        `transformers`: as transformers does: normal(0, initializer_range), norms at 1, biases
        at 0. `pytorch`: each module's PyTorch default: embeddings normal(0, 1), linear
        weights and biases uniform(+-1/sqrt(fan_in)), norms at 1 and 0.
        """
        gen = torch.Generator().manual_seed(seed)
        kinds = self._parameter_kinds()
        std = self.config.initializer_range
        with torch.no_grad():
            for name, param in self.named_parameters():
                kind, fan_in = kinds[name]
                if kind == "norm_weight":
                    param.fill_(1.0)
                elif kind == "norm_bias" or (scheme == "transformers" and kind == "bias"):
                    param.zero_()
                elif scheme == "pytorch" and kind == "embedding":
                    param.copy_(torch.randn(param.shape, generator=gen))
                elif scheme == "pytorch":
                    bound = 1.0 / math.sqrt(fan_in)
                    param.copy_((torch.rand(param.shape, generator=gen) * 2 - 1) * bound)
                else:
                    scale = (
                        std / math.sqrt(2 * self.config.num_layers)
                        if name.endswith(self.residual_projections)
                        else std
                    )
                    param.copy_(torch.randn(param.shape, generator=gen) * scale)

    def _parameter_kinds(self) -> dict[str, tuple[str, int]]:
        kinds: dict[str, tuple[str, int]] = {}
        for prefix, module in self.named_modules():
            for local, _ in module.named_parameters(recurse=False):
                name = f"{prefix}.{local}" if prefix else local
                if isinstance(module, NORMS):
                    kinds[name] = (f"norm_{local}", 0)
                elif isinstance(module, nn.Embedding):
                    kinds[name] = ("embedding", 0)
                elif isinstance(module, Conv1D):
                    kinds[name] = ("bias" if local == "bias" else "matrix", module.weight.shape[0])
                elif isinstance(module, nn.Linear):
                    kinds[name] = ("bias" if local == "bias" else "matrix", module.in_features)
                else:
                    raise TypeError(
                        f"{name} belongs to a {type(module).__name__}, which init_weights does not know"
                    )
        return kinds
