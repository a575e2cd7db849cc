"""The GPT-2 family over packed tokens: LayerNorm, learned absolute positions, GELU MLP.
Parameter names match Hugging Face's GPT2LMHeadModel (Conv1D weights stored [in, out]).

Learned positions suit the tiny from-scratch character models of the demos: copying a
letter from a fixed offset is one lookup for them, and GRPO on reverse-text learns markedly
faster than with the Llama family's rotary positions at the same size (docs/learning.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rlrun.common.model.arch import ArchConfig
from rlrun.common.model.transformer import Attend, CausalLM, Conv1D


class GPT2Attention(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.c_attn = Conv1D(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = Conv1D(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, attend: Attend, layer: int) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.c_attn(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        return self.c_proj(attend(layer, q, k, v).reshape(t, self.num_heads * self.head_dim))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.c_fc = Conv1D(cfg.hidden_size, cfg.intermediate_size)
        self.c_proj = Conv1D(cfg.intermediate_size, cfg.hidden_size)
        self.approximate = "none" if cfg.activation == "gelu" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class GPT2Block(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: torch.Tensor, attend: Attend, layer: int) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attend, layer)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)


class GPT2LMHeadModel(CausalLM):
    embedding_key = "transformer.wte.weight"
    learned_positions = True
    residual_projections = ("attn.c_proj.weight", "mlp.c_proj.weight")

    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.config = cfg
        self.transformer = GPT2Model(cfg)
        self._add_lm_head()

    def normalize_checkpoint_names(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # The original GPT-2 checkpoints name tensors without the `transformer.` prefix and
        # store each layer's causal-mask buffers (`attn.bias`, `attn.masked_bias`).
        out = {}
        for name, tensor in state.items():
            if name.endswith((".attn.bias", ".attn.masked_bias")):
                continue
            out[name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"] = tensor
        return out

    def decoder_layers(self) -> nn.ModuleList:
        return self.transformer.h

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        for i, block in enumerate(self.transformer.h):
            x = block(x, attend, i)
        return self.transformer.ln_f(x)
