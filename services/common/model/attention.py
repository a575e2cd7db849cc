"""How a forward pass attends. The model is written over packed tokens [T, ...]; the
attention context decides what each token may see:

- PackedCausal: several sequences packed back to back (training, scoring). Varlen
  attention done by scattering into a right-padded batch, so no token sees another
  sequence and padding never reaches a real query.
- SlotKVCache: continuous batching. Every running sequence owns a cache slot; each token
  writes its K/V at (slot, position) and attends to its slot's positions up to its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=-3)


@dataclass
class PackedCausal:
    """cu_seqlens: [n+1] offsets of n packed sequences (int64)."""

    cu_seqlens: torch.Tensor

    def __post_init__(self) -> None:
        lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
        self.lengths = lengths
        self.max_len = int(lengths.max()) if len(lengths) else 0
        seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        self.rows = seq
        self.cols = torch.arange(int(self.cu_seqlens[-1])) - self.cu_seqlens[:-1][seq]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, KV, D]
        n, length = len(self.lengths), self.max_len

        def pad(x: torch.Tensor) -> torch.Tensor:
            out = x.new_zeros((n, length, *x.shape[1:]))
            out[self.rows, self.cols] = x
            return out.transpose(1, 2)  # [n, heads, L, D]

        qp, kp, vp = pad(q), pad(k), pad(v)
        groups = q.shape[1] // k.shape[1]
        out = F.scaled_dot_product_attention(
            qp, _expand_kv(kp, groups), _expand_kv(vp, groups), is_causal=True
        )
        return out.transpose(1, 2)[self.rows, self.cols]


class SlotKVCache:
    """Per-layer K/V storage of shape [slots, max_len, kv_heads, head_dim]."""

    def __init__(
        self,
        num_layers: int,
        slots: int,
        max_len: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        shape = (slots, max_len, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.slots = slots

    def step(self, slot_ids: torch.Tensor, positions: torch.Tensor) -> CachedStep:
        return CachedStep(self, slot_ids, positions)


@dataclass
class CachedStep:
    """One forward over tokens of running sequences: token t belongs to slot_ids[t] at positions[t]."""

    cache: SlotKVCache
    slot_ids: torch.Tensor
    positions: torch.Tensor

    def __post_init__(self) -> None:
        span = int(self.positions.max()) + 1
        self.span = span
        # Token t sees cache positions 0..positions[t] of its own slot.
        self.visible = torch.arange(span, device=self.positions.device)[None, :] <= self.positions[:, None]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ck, cv = self.cache.k[layer], self.cache.v[layer]
        ck[self.slot_ids, self.positions] = k
        cv[self.slot_ids, self.positions] = v
        keys = ck[self.slot_ids, : self.span].transpose(1, 2)  # [T, KV, S, D]
        values = cv[self.slot_ids, : self.span].transpose(1, 2)
        groups = q.shape[1] // k.shape[1]
        out = F.scaled_dot_product_attention(
            q[:, :, None, :],
            _expand_kv(keys, groups),
            _expand_kv(values, groups),
            attn_mask=self.visible[:, None, None, :],
        )
        return out[:, :, 0, :]
