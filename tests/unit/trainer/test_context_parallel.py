"""Context parallelism without a process group: `trainer.context_parallel` is checked where
it is read, and splitting a packed micro-batch into chunks keeps every token and prediction
row exactly once, in place. The ring itself runs in
tests/integration/trainer/test_context_parallel.py (two gloo ranks against one process)."""

from __future__ import annotations

import pytest
import torch

from rlrun.common.config import ConfigError
from rlrun.trainer.context_parallel import ROW_FIELDS, split_micro_batch
from rlrun.trainer.distributed import init_parallelism
from rlrun.trainer.packing import pack_micro_batch
from rlrun.trainer.synthetic import synthetic_batch, synthetic_config


@pytest.mark.parametrize("size", [0, -2])
def test_a_context_group_of_fewer_than_one_rank_is_refused_naming_the_key(size, tmp_path):
    with pytest.raises(ConfigError) as error:
        synthetic_config(tmp_path, trainer={"context_parallel": size})
    assert error.value.path == "trainer.context_parallel"


@pytest.mark.parametrize(("world_size", "size"), [(1, 2), (3, 2), (4, 3)])
def test_a_world_size_that_is_no_multiple_of_the_group_is_refused(world_size, size, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    config = synthetic_config(tmp_path, trainer={"context_parallel": size})
    with pytest.raises(ValueError, match=rf"trainer.context_parallel = {size} .* {world_size} rank"):
        init_parallelism(config.trainer)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_chunks_hold_every_token_and_prediction_row_once_in_place(size):
    micro = pack_micro_batch(synthetic_batch(0, num_samples=5).samples)
    total = micro.num_tokens
    chunks = [split_micro_batch(micro, rank, size) for rank in range(size)]
    chunk = chunks[0].num_tokens
    assert all(c.num_tokens == chunk for c in chunks) and chunk == -(-total // size)
    pad = chunk * size - total
    tokens = torch.cat([c.input_ids for c in chunks])
    positions = torch.cat([c.positions for c in chunks])
    assert torch.equal(tokens[:total], micro.input_ids) and torch.equal(positions[:total], micro.positions)
    # The padding is a sample of its own, from position 0, after every real one.
    assert torch.equal(positions[total:], torch.arange(pad))
    expected_offsets = micro.cu_seqlens.tolist() + ([total + pad] if pad else [])
    assert all(c.cu_seqlens.tolist() == expected_offsets for c in chunks)
    # Each prediction row on exactly one rank, at its token, with its own loss inputs.
    rows = torch.cat([c.predict_rows + rank * chunk for rank, c in enumerate(chunks)])
    assert torch.equal(rows, micro.predict_rows)
    for name in ROW_FIELDS:
        assert torch.equal(torch.cat([getattr(c, name) for c in chunks]), getattr(micro, name)), name
