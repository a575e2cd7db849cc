"""Packing invariants: capacity, coverage, rank balance, per-sample positions, no attention
across samples."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlrun.common.model import PackedCausal, build_model
from rlrun.common.wire.trace import Channel
from rlrun.common.wire.training import TrainingSample
from rlrun.trainer.packing import (
    assign_to_ranks,
    count_channel_tokens,
    pack_first_fit_decreasing,
    pack_micro_batch,
    plan_rank_micro_batches,
)
from rlrun.trainer.synthetic import synthetic_batch, synthetic_config


def test_first_fit_decreasing_on_a_hand_example():
    assert pack_first_fit_decreasing([5, 4, 3, 3, 2, 1], capacity=8) == [[0, 2], [1, 3, 5], [4]]


def test_a_sample_longer_than_the_capacity_fails_loudly():
    with pytest.raises(ValueError, match="sample 1 has 9 tokens"):
        pack_first_fit_decreasing([3, 9], capacity=8)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60), capacity=st.integers(40, 120))
def test_first_fit_decreasing_invariants(lengths, capacity):
    bins = pack_first_fit_decreasing(lengths, capacity)
    loads = [sum(lengths[i] for i in b) for b in bins]
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(load <= capacity for load in loads)
    # First fit never leaves two micro-batches that could have been one.
    assert all(loads[i] + loads[j] > capacity for i in range(len(bins)) for j in range(i + 1, len(bins)))


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60), world=st.integers(1, 5))
def test_every_rank_gets_the_same_number_of_micro_batches(lengths, world):
    bins = pack_first_fit_decreasing(lengths, 64)
    per_rank = assign_to_ranks(bins, lengths, world)
    assert len(per_rank) == world
    assert len({len(r) for r in per_rank}) == 1
    assert len(per_rank[0]) == max(1, -(-len(bins) // world))
    real = sorted(tuple(m) for r in per_rank for m in r if m)
    assert real == sorted(tuple(b) for b in bins)


def test_ranks_are_balanced_by_tokens():
    lengths = [10, 10, 10, 10, 1, 1]
    per_rank = assign_to_ranks([[0], [1], [2], [3], [4, 5]], lengths, 2)
    loads = [sum(lengths[i] for m in r for i in m) for r in per_rank]
    assert sorted(loads) == [20, 22]


def sample(tokens: list[int], mask: list[bool], channels: list[Channel]) -> TrainingSample:
    n = len(tokens)
    return TrainingSample(
        tokens, mask, [-float(i) / 10 for i in range(n)], [1.0 + i for i in range(n)], channels
    )


def test_packed_micro_batch_restarts_positions_and_aligns_prediction_rows():
    a = sample(
        [5, 6, 7], [False, True, True], [Channel("rl", [0.0, 2.0, 2.0]), Channel("rl", [0.0, 1.0, -1.0])]
    )
    b = sample([8, 9], [True, True], [Channel("ce", [1.0, 3.0])])
    packed = pack_micro_batch([a, b])
    assert packed.input_ids.tolist() == [5, 6, 7, 8, 9]
    assert packed.positions.tolist() == [0, 1, 2, 0, 1]
    assert packed.cu_seqlens.tolist() == [0, 3, 5]
    # Token i is predicted from position i - 1 of the same sample; first tokens never train.
    assert packed.predict_rows.tolist() == [0, 1, 3]
    assert packed.targets.tolist() == [6, 7, 9]
    assert packed.temperatures.tolist() == [2.0, 3.0, 2.0]
    assert packed.sampling_logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.1])
    assert packed.advantages.tolist() == [3.0, 1.0, 0.0]  # same-loss channels are summed
    assert packed.ce_weights.tolist() == [0.0, 0.0, 3.0]
    assert packed.rl_mask.tolist() == [True, True, False]
    assert packed.ce_mask.tolist() == [False, False, True]


def test_channel_counts_cover_masked_in_tokens_after_position_zero():
    a = sample([5, 6, 7], [True, True, False], [Channel("rl", [1.0, 1.0, 1.0])])
    b = sample([8, 9, 10], [True, True, True], [Channel("ce", [1.0] * 3), Channel("rl", [0.0] * 3)])
    c = sample([8, 9], [True, True], [])
    counts = count_channel_tokens([a, b, c])
    assert (counts.rl, counts.ce, counts.trained, counts.total) == (3, 2, 3, 8)


def test_the_padding_micro_batch_trains_nothing():
    packed = pack_micro_batch([])
    assert packed.predict_rows.numel() == 1
    assert not packed.rl_mask.any() and not packed.ce_mask.any()


def test_rank_plans_cover_every_sample_once():
    batch = synthetic_batch(0, num_samples=23)
    plans = [plan_rank_micro_batches(batch.samples, 64, 3, rank) for rank in range(3)]
    assert len({len(p) for p in plans}) == 1
    real_tokens = sum(int(m.rl_mask.sum()) for p in plans for m in p)
    assert real_tokens == count_channel_tokens(batch.samples).rl


def test_packed_forward_equals_each_sample_alone(tmp_path):
    torch.manual_seed(0)
    model = build_model(synthetic_config(tmp_path).model)
    samples = synthetic_batch(0, num_samples=4).samples
    packed = pack_micro_batch(samples)
    with torch.no_grad():
        together = model(packed.input_ids, packed.positions, PackedCausal.from_offsets(packed.cu_seqlens))
        for i, s in enumerate(samples):
            alone = pack_micro_batch([s])
            own = model(alone.input_ids, alone.positions, PackedCausal.from_offsets(alone.cu_seqlens))
            start, end = packed.cu_seqlens[i].item(), packed.cu_seqlens[i + 1].item()
            torch.testing.assert_close(together[start:end], own, rtol=1e-5, atol=1e-5)


def test_observation_tokens_train_under_ce_only():
    """echo: unsampled observation tokens carry a ce weight and stay out of the rl channel."""
    obs = sample(
        [1, 2, 3, 4, 5],
        [False, True, False, False, True],
        [Channel("rl", [0.0, 0.5, 0.0, 0.0, 0.5]), Channel("ce", [0.0, 0.0, 1.0, 1.0, 0.0])],
    )
    counts = count_channel_tokens([obs])
    assert (counts.rl, counts.ce, counts.trained) == (2, 2, 4)
    packed = pack_micro_batch([obs])
    assert packed.rl_mask.tolist() == [True, False, False, True]
    assert packed.ce_mask.tolist() == [False, True, True, False]
