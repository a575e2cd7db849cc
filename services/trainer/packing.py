"""Packing a batch into micro-batches (pure: no I/O, no model).

Samples are packed first-fit-decreasing into micro-batches of at most `capacity` tokens, the
micro-batches are dealt to ranks so that token loads balance, and every rank gets the same
number of micro-batches (short ranks get padding micro-batches that train nothing), because
FSDP and DDP run one collective per micro-batch and every rank must join each of them.

A packed micro-batch feeds the model its samples back to back: positions restart at 0 for
each sample and `cu_seqlens` marks where each starts, so attention never crosses samples.
Token i of a sample is predicted by the logits at its position i - 1; position 0 never trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rlrun.common.wire.training import TrainingSample

# A padding micro-batch: two tokens (so one prediction row exists and the backward pass
# reaches every parameter) with nothing masked in, so it adds exactly zero to loss and grads.
PADDING_SAMPLE = TrainingSample(
    token_ids=[0, 0], mask=[False, False], logprobs=[0.0, 0.0], temperatures=[1.0, 1.0], channels=[]
)


def pack_first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Sample indices per micro-batch. Longest samples are placed first, each into the first
    micro-batch with room; every micro-batch holds at most `capacity` tokens."""
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for index in order:
        length = lengths[index]
        if length > capacity:
            raise ValueError(
                f"sample {index} has {length} tokens, more than the micro-batch capacity {capacity}"
            )
        for b, load in enumerate(loads):
            if load + length <= capacity:
                bins[b].append(index)
                loads[b] += length
                break
        else:
            bins.append([index])
            loads.append(length)
    return bins


def assign_to_ranks(bins: list[list[int]], lengths: Sequence[int], world_size: int) -> list[list[list[int]]]:
    """Deals micro-batches to ranks, heaviest first onto the least-loaded rank. Every rank
    gets the same number of entries; an empty list is a padding micro-batch."""
    per_rank: list[list[list[int]]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for micro in sorted(bins, key=lambda b: -sum(lengths[i] for i in b)):
        rank = min(range(world_size), key=lambda r: (loads[r], len(per_rank[r]), r))
        per_rank[rank].append(micro)
        loads[rank] += sum(lengths[i] for i in micro)
    count = max(1, max(len(r) for r in per_rank))
    for micro_batches in per_rank:
        micro_batches.extend([] for _ in range(count - len(micro_batches)))
    return per_rank


@dataclass(frozen=True)
class ChannelCounts:
    """Token counts over the whole batch (all ranks): the loss normalizers."""

    rl: int
    """Masked-in (model-sampled) tokens (position >= 1) of samples that carry an rl channel."""
    ce: int
    """Tokens (position >= 1) with a nonzero ce weight, sampled or not (echo trains observations)."""
    trained: int
    """Tokens (position >= 1) that train under at least one channel."""
    total: int
    """All tokens of the batch."""


def channel_masks(sample: TrainingSample) -> tuple[list[bool], list[bool]]:
    """Per token: trains under rl (the sample's mask, when it has an rl channel), and trains
    under ce (a nonzero ce weight)."""
    n = len(sample.token_ids)
    has_rl = any(channel.loss == "rl" for channel in sample.channels)
    return (list(sample.mask) if has_rl else [False] * n), [w != 0.0 for w in _channel_sum(sample, "ce")]


def count_channel_tokens(samples: Sequence[TrainingSample]) -> ChannelCounts:
    rl = ce = trained = total = 0
    for sample in samples:
        rl_mask, ce_mask = channel_masks(sample)
        rl += sum(rl_mask[1:])
        ce += sum(ce_mask[1:])
        trained += sum(r or c for r, c in zip(rl_mask[1:], ce_mask[1:], strict=True))
        total += len(sample.token_ids)
    return ChannelCounts(rl=rl, ce=ce, trained=trained, total=total)


@dataclass(frozen=True)
class PackedMicroBatch:
    """One micro-batch as model inputs plus per-prediction-row loss inputs.

    Model inputs have one entry per packed token (T); loss inputs have one row per predicted
    token (P = T - number of samples), aligned with `logits[predict_rows]`."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, restarting at 0 per sample
    cu_seqlens: torch.Tensor  # [n + 1] int64
    predict_rows: torch.Tensor  # [P] int64: the packed position whose logits predict the target
    targets: torch.Tensor  # [P] int64
    temperatures: torch.Tensor  # [P] float32
    sampling_logprobs: torch.Tensor  # [P] float32 (μ)
    advantages: torch.Tensor  # [P] float32: the sum of the sample's rl channels
    ce_weights: torch.Tensor  # [P] float32: the sum of the sample's ce channels
    rl_mask: torch.Tensor  # [P] bool: masked in and the sample has an rl channel
    ce_mask: torch.Tensor  # [P] bool: masked in and the sample has a ce channel

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> PackedMicroBatch:
        """Moves everything but `cu_seqlens`, which stays on the CPU: PackedCausal reads its
        lengths from it (CPU scatter indices index GPU tensors fine)."""
        return PackedMicroBatch(
            **{
                name: getattr(self, name) if name == "cu_seqlens" else getattr(self, name).to(device)
                for name in self.__dataclass_fields__
            }
        )


def _tensor(values: list, dtype) -> torch.Tensor:
    # Through numpy: several times faster than torch.tensor on a Python list.
    return torch.from_numpy(np.asarray(values, dtype=dtype))


def _channel_sum(sample: TrainingSample, kind: str) -> list[float]:
    total = [0.0] * len(sample.token_ids)
    for channel in sample.channels:
        if channel.loss == kind:
            total = [a + b for a, b in zip(total, channel.values, strict=True)]
    return total


def pack_micro_batch(samples: Sequence[TrainingSample]) -> PackedMicroBatch:
    """Packs `samples` (in order) into one micro-batch; an empty sequence gives the padding
    micro-batch."""
    samples = list(samples) or [PADDING_SAMPLE]
    input_ids: list[int] = []
    positions: list[int] = []
    cu_seqlens = [0]
    rows: list[int] = []
    targets: list[int] = []
    temperatures: list[float] = []
    logprobs: list[float] = []
    advantages: list[float] = []
    ce_weights: list[float] = []
    rl_mask: list[bool] = []
    ce_mask: list[bool] = []
    for sample in samples:
        start = cu_seqlens[-1]
        n = len(sample.token_ids)
        sample_rl_mask, sample_ce_mask = channel_masks(sample)
        input_ids += sample.token_ids
        positions += range(n)
        cu_seqlens.append(start + n)
        rows += range(start, start + n - 1)
        targets += sample.token_ids[1:]
        temperatures += sample.temperatures[1:]
        logprobs += sample.logprobs[1:]
        advantages += _channel_sum(sample, "rl")[1:]
        ce_weights += _channel_sum(sample, "ce")[1:]
        rl_mask += sample_rl_mask[1:]
        ce_mask += sample_ce_mask[1:]
    return PackedMicroBatch(
        input_ids=_tensor(input_ids, np.int64),
        positions=_tensor(positions, np.int64),
        cu_seqlens=_tensor(cu_seqlens, np.int64),
        predict_rows=_tensor(rows, np.int64),
        targets=_tensor(targets, np.int64),
        temperatures=_tensor(temperatures, np.float32),
        sampling_logprobs=_tensor(logprobs, np.float32),
        advantages=_tensor(advantages, np.float32),
        ce_weights=_tensor(ce_weights, np.float32),
        rl_mask=_tensor(rl_mask, np.bool_),
        ce_mask=_tensor(ce_mask, np.bool_),
    )


def plan_rank_micro_batches(
    samples: Sequence[TrainingSample], capacity: int, world_size: int, rank: int
) -> list[PackedMicroBatch]:
    """This rank's packed micro-batches for the whole batch (same count on every rank)."""
    lengths = [len(s.token_ids) for s in samples]
    bins = pack_first_fit_decreasing(lengths, capacity)
    mine = assign_to_ranks(bins, lengths, world_size)[rank]
    return [pack_micro_batch([samples[i] for i in micro]) for micro in mine]
