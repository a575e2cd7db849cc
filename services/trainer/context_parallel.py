"""Context parallelism (`trainer.context_parallel = N`): one packed micro-batch is split along
the sequence across the N ranks of a context group, and attention is ring attention.

Each rank holds one contiguous chunk of the (padded) packed sequence: its tokens, their
positions (which restart per sample, so rotary and learned positions need no offset) and the
prediction rows whose logits fall in the chunk. In every layer a rank keeps its queries and
passes its keys and values around the ring: after N - 1 shifts it has attended to every chunk,
merging the chunks' partial softmaxes by their log-sum-exp (the online softmax of flash
attention), so the result equals attention over the whole sequence. The mask of a (query,
key) pair is the one PackedCausal applies: same sample, key at or before the query in the
packed order, so a sample that spans chunks is causal across them.

The ring shift is an autograd function whose backward shifts the gradient the other way, so
the forward is differentiable ops throughout and autograd writes the ring backward: the
gradient of a key chunk flows back, hop by hop, to the rank that computed it. Every rank of
the group runs the same layers and shifts in the same order, which is all P2P needs.

A block (this rank's queries against one chunk) is eager math in float32, recomputed in the
backward pass rather than kept: a layer keeps every chunk's K/V and its output and
log-sum-exp, and one block's [heads, T/N, T/N] scores exist at a time.

Limits: chunks are contiguous, so under the causal mask the last rank does the most work (no
zigzag balancing), and every block is computed, masked or not; no fused attention kernel (a
block costs eager attention's memory while it runs, and its forward twice); the shifts are
not overlapped with the blocks.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from rlrun.common.model.attention import expand_kv
from rlrun.trainer.packing import PackedMicroBatch

# A masked score. Finite, so a query row with no visible key in a chunk gets a log-sum-exp of
# about -1e30 and a merge weight of exactly exp(-1e30 - lse) = 0, with no inf - inf = nan in
# the forward or backward pass (every row sees at least itself in its own chunk).
MASKED = -1e30

# The per-row inputs of the loss: split with the prediction rows.
ROW_FIELDS = (
    "targets",
    "temperatures",
    "sampling_logprobs",
    "advantages",
    "ce_weights",
    "rl_mask",
    "ce_mask",
)


def split_micro_batch(micro: PackedMicroBatch, rank: int, size: int) -> PackedMicroBatch:
    """Rank `rank`'s chunk of `micro`, padded to a multiple of `size` tokens. The padding is
    one extra sample of token 0 at the end, which attends only to itself and predicts
    nothing. `predict_rows` index the chunk's tokens; `cu_seqlens` stays the whole padded
    sequence's offsets, which the ring context needs to mask every chunk."""
    total = micro.num_tokens
    chunk = -(-total // size)
    pad = chunk * size - total
    input_ids, positions, offsets = micro.input_ids, micro.positions, micro.cu_seqlens
    if pad:
        input_ids = torch.cat([input_ids, input_ids.new_zeros(pad)])
        positions = torch.cat([positions, torch.arange(pad, dtype=positions.dtype)])
        offsets = torch.cat([offsets, offsets.new_tensor([total + pad])])
    start = rank * chunk
    mine = (micro.predict_rows >= start) & (micro.predict_rows < start + chunk)
    return PackedMicroBatch(
        input_ids=input_ids[start : start + chunk],
        positions=positions[start : start + chunk],
        cu_seqlens=offsets,
        predict_rows=micro.predict_rows[mine] - start,
        **{name: getattr(micro, name)[mine] for name in ROW_FIELDS},
    )


def _exchange(tensor: torch.Tensor, group: Any, step: int) -> torch.Tensor:
    """Sends `tensor` `step` ranks on around the ring and returns the one from `step` ranks back."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    tensor = tensor.contiguous()
    received = torch.empty_like(tensor)
    works = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, tensor, group=group, group_peer=(rank + step) % size),
            dist.P2POp(dist.irecv, received, group=group, group_peer=(rank - step) % size),
        ]
    )
    for work in works:
        work.wait()
    return received


class _RingShift(torch.autograd.Function):
    """Forward: this rank's tensor to the next rank, the previous rank's back. Backward: the
    gradient the other way round, to the rank whose tensor it is."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _exchange(tensor, group, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _exchange(grad, ctx.group, -1), None


def ring_shift(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    return _RingShift.apply(tensor, group)


def _block(
    queries: torch.Tensor, kv: torch.Tensor, visible: torch.Tensor, scale: float, groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of float32 queries [H, Tq, D] to one chunk's stacked keys and values
    [2, Tk, KV, D] under `visible` [Tq, Tk]: the chunk-normalised output [H, Tq, D] and its
    log-sum-exp [H, Tq]."""
    keys, values = (expand_kv(x.float().transpose(0, 1), groups) for x in kv)
    scores = torch.matmul(queries, keys.transpose(-1, -2)).mul_(scale).masked_fill(~visible, MASKED)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), values), lse


class RingAttention:
    """The attention context of one rank's chunk of a packed sequence split over `group`
    (`split_micro_batch`'s `cu_seqlens`: the whole padded sequence's offsets, a CPU tensor)."""

    def __init__(self, cu_seqlens: torch.Tensor, group: Any, device: torch.device):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        offsets = cu_seqlens.tolist()
        total = offsets[-1]
        if total % self.size:
            raise ValueError(f"{total} tokens do not split into {self.size} chunks (pad them first)")
        chunk = total // self.size
        sample = torch.cat(
            [
                torch.full((end - start,), i, dtype=torch.int64)
                for i, (start, end) in enumerate(pairwise(offsets))
            ]
        ).to(device)
        index = torch.arange(total, device=device)
        mine = slice(self.rank * chunk, (self.rank + 1) * chunk)
        q_sample, q_index = sample[mine, None], index[mine, None]
        # visible[c]: may this rank's query see the key of chunk c (same sample, not later)?
        self.visible = [
            (q_sample == sample[None, c * chunk : (c + 1) * chunk])
            & (index[None, c * chunk : (c + 1) * chunk] <= q_index)
            for c in range(self.size)
        ]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [Tc, H, D]; k, v: [Tc, KV, D], this rank's chunk
        groups = q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        queries = q.float().transpose(0, 1)
        kv = torch.stack([k, v])  # one tensor, one shift per hop: [2, Tc, KV, D]

        def attend(kv: torch.Tensor, source: int) -> tuple[torch.Tensor, torch.Tensor]:
            # Recomputed in the backward pass (as a flash kernel does), so a layer keeps its
            # chunks' K/V for it, not [H, Tc, Tc] scores and probabilities per chunk.
            return checkpoint(_block, queries, kv, self.visible[source], scale, groups, use_reentrant=False)

        out, lse = attend(kv, self.rank)
        for hop in range(1, self.size):
            kv = ring_shift(kv, self.group)
            block_out, block_lse = attend(kv, (self.rank - hop) % self.size)
            # The online softmax: both parts rescaled to the merged normaliser.
            merged = torch.logaddexp(lse, block_lse)
            out = (
                out * torch.exp(lse - merged)[..., None]
                + block_out * torch.exp(block_lse - merged)[..., None]
            )
            lse = merged
        return out.transpose(0, 1).to(q.dtype)
