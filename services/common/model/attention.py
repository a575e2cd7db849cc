"""How a forward pass attends. The model is written over packed tokens [T, ...]; the
attention context decides what each token may see:

- PackedCausal: several sequences packed back to back (training, scoring, prompts joining
  a decode step). Varlen attention done by scattering into a right-padded batch (a view when
  all have one length), so no token sees another sequence and padding never reaches a
  real query.
- SlotKVCache: continuous batching. Every running sequence owns a cache slot; each token
  writes its K/V at (slot, position). A running sequence's next token attends to its slot's
  positions up to its own; a newly admitted prompt attends causally within itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F


def expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=-3)


class PackedCausal:
    """Sequences of `lengths` tokens packed back to back, each attending causally within
    itself. Built from Python ints, so no tensor is read back to plan the padding."""

    def __init__(self, lengths: Sequence[int]):
        if isinstance(lengths, torch.Tensor):
            raise TypeError("PackedCausal takes lengths as ints; offsets in a tensor go to from_offsets")
        self.lengths = list(lengths)
        self.max_len = max(self.lengths, default=0)
        # Sequences of one length are already a padded batch: a view, no scatter.
        self.uniform = all(n == self.max_len for n in self.lengths)
        if not self.uniform:
            self.rows = torch.tensor([i for i, n in enumerate(self.lengths) for _ in range(n)])
            self.cols = torch.tensor([j for n in self.lengths for j in range(n)])

    @classmethod
    def from_offsets(cls, cu_seqlens: torch.Tensor) -> PackedCausal:
        """From [n+1] offsets of n packed sequences (a CPU tensor)."""
        offsets = cu_seqlens.tolist()
        return cls([end - start for start, end in pairwise(offsets)])

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, KV, D]
        n, length = len(self.lengths), self.max_len

        def pad(x: torch.Tensor) -> torch.Tensor:
            if self.uniform:
                return x.unflatten(0, (n, length)).transpose(1, 2)
            out = x.new_zeros((n, length, *x.shape[1:]))
            out[self.rows, self.cols] = x
            return out.transpose(1, 2)  # [n, heads, L, D]

        qp, kp, vp = pad(q), pad(k), pad(v)
        groups = q.shape[1] // k.shape[1]
        out = F.scaled_dot_product_attention(
            qp, expand_kv(kp, groups), expand_kv(vp, groups), is_causal=True
        ).transpose(1, 2)  # [n, L, heads, D]
        return out.flatten(0, 1) if self.uniform else out[self.rows, self.cols]


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

    def step(
        self,
        slot_ids: torch.Tensor,
        positions: torch.Tensor,
        prompt_lengths: list[int] | tuple[int, ...] = (),
    ) -> CachedStep:
        """A forward over `len(slot_ids)` tokens: first one next token per running sequence
        (distinct slots), then the whole prompts of newly admitted sequences, back to back,
        each from position 0 and in a slot of its own (`prompt_lengths`)."""
        prompts = None
        if prompt_lengths:
            prompts = PackedCausal(prompt_lengths)
        return CachedStep(self, slot_ids, positions, len(slot_ids) - sum(prompt_lengths), prompts)


@dataclass
class CachedStep:
    """Token t writes its K/V at (slot_ids[t], positions[t]). The first `decode` tokens attend
    to their slot's cache up to their position; the prompts after them attend causally within
    themselves (a fresh sequence has nothing cached yet, so its prompt needs no cache read)."""

    cache: SlotKVCache
    slot_ids: torch.Tensor
    positions: torch.Tensor
    decode: int
    prompts: PackedCausal | None = None

    def __post_init__(self) -> None:
        if not self.decode:
            return
        slot_ids, positions = self.slot_ids[: self.decode], self.positions[: self.decode]
        self.span = int(positions.max()) + 1
        self.used = int(slot_ids.max()) + 1
        # With the running slots packed low (the scheduler reuses the most recently freed
        # slot), attending over every slot below the highest one reads the cache in place;
        # gathering each sequence's slot copies span x heads x dim per token, which costs more.
        self.in_place = self.used <= 2 * self.decode
        arange = torch.arange(self.span, device=positions.device)[None, :]
        if self.in_place:
            # Free slots in range attend to position 0 only: finite, and never read back.
            slot_positions = torch.zeros(self.used, dtype=positions.dtype, device=positions.device)
            slot_positions[slot_ids] = positions
            self.visible = arange <= slot_positions[:, None]
        else:
            self.visible = arange <= positions[:, None]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ck, cv = self.cache.k[layer], self.cache.v[layer]
        ck[self.slot_ids, self.positions] = k
        cv[self.slot_ids, self.positions] = v
        n = self.decode
        parts = []
        if n:
            slot_ids = self.slot_ids[:n]
            groups = q.shape[1] // k.shape[1]
            if self.in_place:
                keys = ck[: self.used, : self.span].transpose(1, 2)  # views: [used, KV, S, D]
                values = cv[: self.used, : self.span].transpose(1, 2)
                queries = q.new_zeros((self.used, q.shape[1], 1, q.shape[2]))
                queries[slot_ids] = q[:n, :, None, :]
            else:
                keys = ck[slot_ids, : self.span].transpose(1, 2)  # [n, KV, S, D]
                values = cv[slot_ids, : self.span].transpose(1, 2)
                queries = q[:n, :, None, :]
            out = F.scaled_dot_product_attention(
                queries,
                expand_kv(keys, groups),
                expand_kv(values, groups),
                attn_mask=self.visible[:, None, None, :],
            )
            parts.append(out[slot_ids, :, 0, :] if self.in_place else out[:, :, 0, :])
        if self.prompts is not None:
            parts.append(self.prompts(layer, q[n:], k[n:], v[n:]))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class StaticSlotStep:
    """A decode step of static shape, as a CUDA graph needs: row r is slot r, for the first
    `len(positions)` slots, each one token at its position attending to its slot's cache
    up to there. Rows whose slot runs nothing are padding: they write their K/V into the
    scratch slot (`write_slots`), which no sequence reads, and attend to position 0 only
    (finite, and never sampled). `span` (a Python int) is how many positions are read.

    Row = slot needs no gather of keys: the cache is read in place, a view. Grouped-query
    heads fold into the query length ([rows, kv_heads, groups, dim] queries against
    [rows, kv_heads, span, dim] keys), so no K/V is expanded either. The mask is an
    additive bias of the cache's dtype, built once per step: SDPA's memory-efficient kernel
    takes it as is on CUDA (flash takes no mask, and a boolean one would be converted in
    every layer), and spans in multiples of 16 keep it aligned for that kernel."""

    def __init__(self, cache: SlotKVCache, write_slots: torch.Tensor, positions: torch.Tensor, span: int):
        self.cache = cache
        self.rows = len(positions)
        self.span = span
        # Token t's K/V goes to the flattened [slots * max_len] row of (slot, position):
        # index_copy_ on a static index, no host-side indexing.
        self.write_index = write_slots * cache.max_len + positions
        visible = torch.arange(span, device=positions.device)[None, :] <= positions[:, None]
        dtype = cache.k[0].dtype
        bias = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
        self.bias = bias.masked_fill_(~visible, float("-inf"))[:, None, None, :]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ck, cv = self.cache.k[layer], self.cache.v[layer]
        ck.flatten(0, 1).index_copy_(0, self.write_index, k)
        cv.flatten(0, 1).index_copy_(0, self.write_index, v)
        rows, heads, dim = q.shape
        kv_heads = k.shape[1]
        keys = ck[:rows, : self.span].transpose(1, 2)  # views: [rows, KV, span, D]
        values = cv[:rows, : self.span].transpose(1, 2)
        queries = q.view(rows, kv_heads, heads // kv_heads, dim)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.bias)
        return out.reshape(rows, heads, dim)
