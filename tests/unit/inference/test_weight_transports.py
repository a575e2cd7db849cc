"""IPC updates into the in-process torch engine (the engine thread maps the staging buffer):
the version changes once the copy is done, even if the caller stopped waiting, and never
undoes a later update."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlrun.common.errors import RequestError
from rlrun.common.weights.ipc import StagingBuffer, ipc_header, ipc_source
from rlrun.common.wire.weights import CudaIpcHandle, WeightUpdateHeader

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


def cuda_header(engine, **handle) -> WeightUpdateHeader:
    _, staging = staged(engine, seed=11)
    header = ipc_header(staging, 1)
    fields = {
        "device": 0,
        "handle": b"\x01\x00" + bytes(range(64)),
        "storage_size_bytes": staging.size,
        "storage_offset_bytes": 512,
        "ref_counter_handle": b"/torch_7_8_9",
        "ref_counter_offset": 3,
        "event_handle": bytes(64),
        "event_sync_required": True,
    }
    header.ipc.cuda, header.ipc.shared_memory = CudaIpcHandle(**{**fields, **handle}), None
    return header


async def test_a_cuda_handle_is_rebuilt_field_by_field_in_torchs_order(engine):
    source = ipc_source(cuda_header(engine), engine.weight_specs())
    assert source.shared_memory is None
    # UntypedStorage._new_shared_cuda(device, handle, size, offset, ref counter handle, ref
    # counter offset, event handle, event sync required)
    assert source.cuda == (
        0,
        b"\x01\x00" + bytes(range(64)),
        source.size,
        512,
        b"/torch_7_8_9",
        3,
        bytes(64),
        True,
    )


@pytest.mark.parametrize(
    ("handle", "field"),
    [
        ({"handle": b""}, "header.ipc.cuda.handle"),
        ({"handle": bytes(5000)}, "header.ipc.cuda.handle"),
        ({"event_handle": bytes(10)}, "header.ipc.cuda.event_handle"),
        ({"storage_offset_bytes": -1}, "header.ipc.cuda"),
    ],
)
async def test_a_malformed_cuda_handle_names_its_field(engine, handle, field):
    with pytest.raises(RequestError) as caught:
        ipc_source(cuda_header(engine, **handle), engine.weight_specs())
    assert caught.value.field == field
