"""The CUDA variants of the fetched weight transports: the trainer (this process) on a GPU, a
real inference service whose engine process holds the model on a GPU. CUDA IPC on one GPU;
a torch.distributed NCCL group across two (two NCCL ranks cannot share a GPU). They skip
cleanly without the GPUs they need."""

from __future__ import annotations

import pytest
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.weights.collective import CollectiveWeightBroadcaster
from rlrun.common.weights.grpc_stream import GrpcWeightBroadcaster
from rlrun.common.weights.ipc import IpcWeightBroadcaster
from rlrun.trainer.weight_sync import AutoWeightBroadcaster, measure_sync

from .conftest import other_weights
from .test_weight_transports import greedy_tokens, served_version

pytestmark = pytest.mark.gpu

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs (NCCL ranks cannot share a GPU)")
SETTINGS = BroadcastConfig(retries=1, timeout_s=120)


def on(device: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in tensors.items()}


async def check_round_trip(service, broadcaster, device: str) -> None:
    """An update of other weights changes what Generate serves; the original weights, over the
    same kept buffer or group, bring it back."""
    config = service.service.config
    before = await greedy_tokens(service.stub)
    (result,) = await broadcaster.broadcast(on(device, other_weights(config, seed=9)), 1)
    assert result.ok, result.error
    assert await greedy_tokens(service.stub) != before
    (result,) = await broadcaster.broadcast(on(device, other_weights(config, config.model.seed)), 2)
    assert result.ok, result.error
    assert await greedy_tokens(service.stub) == before
    assert await served_version(service.stub) == 2


@needs_gpu
async def test_cuda_ipc_reaches_a_replica_on_the_same_gpu(start_service):
    service = await start_service('inference.device="cuda:0"', http=False)
    broadcaster = IpcWeightBroadcaster([service.address], SETTINGS, ClientOptions())
    try:
        await check_round_trip(service, broadcaster, "cuda:0")
        assert broadcaster.staging.buffer.WhichOneof("handle") == "cuda"
    finally:
        await broadcaster.close()


@needs_gpu
async def test_auto_picks_cuda_ipc_for_a_replica_on_the_trainers_node(start_service):
    service = await start_service('inference.device="cuda:0"', http=False)
    addresses, client = [service.address], ClientOptions()
    auto = AutoWeightBroadcaster(
        addresses,
        {
            "grpc": GrpcWeightBroadcaster(addresses, SETTINGS, client),
            "ipc": IpcWeightBroadcaster(addresses, SETTINGS, client),
        },
        client,
        SETTINGS,
        torch.device("cuda:0"),
    )
    try:
        await check_round_trip(service, auto, "cuda:0")
        assert auto.choices == {service.address: "ipc"}
    finally:
        await auto.close()


@needs_two_gpus
async def test_a_torch_nccl_group_reaches_a_replica_on_another_gpu(start_service):
    service = await start_service('inference.device="cuda:1"', http=False)
    broadcaster = CollectiveWeightBroadcaster(
        [service.address], SETTINGS, ClientOptions(), host="127.0.0.1", backend="nccl", device="cuda:0"
    )
    try:
        await check_round_trip(service, broadcaster, "cuda:0")
        assert broadcaster.generation == 1
    finally:
        await broadcaster.close()


@needs_gpu
@pytest.mark.parametrize("transport", ["ipc", "auto", "grpc"])
async def test_measure_sync_reports_bytes_and_seconds_per_round(start_service, transport):
    service = await start_service('inference.device="cuda:0"', http=False)
    tensors = on("cuda:0", other_weights(service.service.config, seed=9))
    results = await measure_sync(service.address, tensors, transport, rounds=3)
    assert [r.bytes for r in results] == [sum(t.nbytes for t in tensors.values())] * 3
    assert await served_version(service.stub) == 3
    print(transport, "weight sync GB/s:", [round(r.bytes / r.seconds / 1e9, 3) for r in results])
