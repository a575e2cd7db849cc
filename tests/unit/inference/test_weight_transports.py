"""IPC updates into the in-process torch engine (the engine thread maps the staging buffer):
the version changes once the copy is done, even if the caller stopped waiting, and never
undoes a later update."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlrun.common.errors import RequestError
from rlrun.trainer.ipc_broadcast import StagingBuffer, ipc_header

from .conftest import tiny_model


def staged(engine, seed: int) -> tuple[dict[str, torch.Tensor], StagingBuffer]:
    weights = {name: tensor.clone() for name, tensor in tiny_model(seed).state_dict().items()}
    specs = tuple((name, t.dtype, tuple(t.shape)) for name, t in engine.weight_specs().items())
    staging = StagingBuffer(specs, torch.device("cpu"))
    staging.stage(weights)
    return weights, staging


def holds(engine, weights: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(engine.core.tensors[name], weights[name]) for name in weights)


async def test_an_ipc_update_is_copied_in_before_the_call_returns(engine):
    weights, staging = staged(engine, seed=11)
    seconds = await engine.receive_weights_ipc(ipc_header(staging, 4))
    assert seconds > 0 and engine.policy_version == 4 and holds(engine, weights)
    # The trainer may now overwrite its buffer: the model keeps what it copied.
    staging.stage({name: torch.zeros_like(t) for name, t in weights.items()})
    assert holds(engine, weights)


async def test_an_ipc_update_that_cannot_be_opened_changes_nothing(engine):
    original = {name: t.clone() for name, t in engine.core.tensors.items()}
    _, staging = staged(engine, seed=11)
    header = ipc_header(staging, 4)
    header.ipc.shared_memory.name = "/torch_1_2_3"
    header.ipc.buffer_id = "elsewhere"
    with pytest.raises(RequestError) as caught:
        await engine.receive_weights_ipc(header)
    assert caught.value.field == "header.ipc"
    assert engine.policy_version == 0 and holds(engine, original)
    # The engine goes on serving, and takes the next good update.
    await engine.receive_weights_ipc(ipc_header(staging, 5))
    assert engine.policy_version == 5


async def test_an_abandoned_ipc_update_never_undoes_a_later_one(engine):
    _, staging = staged(engine, seed=11)
    fetch = asyncio.create_task(engine.receive_weights_ipc(ipc_header(staging, 4)))
    await asyncio.sleep(0)  # dispatched to the engine
    fetch.cancel()
    later = {name: t.clone() for name, t in tiny_model(seed=12).state_dict().items()}
    await engine.update_weights(later, version=5)
    await asyncio.sleep(0.2)  # the fetch's answer arrives after the later commit
    assert engine.policy_version == 5
    # The engine applied them in order: the later update is what it serves.
    await engine.score([4, 20, 21], 1, 1.0)  # runs after both updates
    assert engine.core.version == 5 and holds(engine, later)
