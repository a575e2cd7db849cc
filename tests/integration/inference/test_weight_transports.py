"""Weight updates whose bytes bypass the gRPC stream, end to end on CPU: the trainer's
broadcasters (this process) -> a real inference service -> its engine process, which maps the
trainer's shared-memory staging buffer (the IPC path) or joins a gloo weight group (the
torch.distributed path, the NCCL code over gloo), then Generate."""

from __future__ import annotations

import time

import grpc
import pytest
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.weights.collective import CollectiveWeightBroadcaster
from rlrun.common.weights.grpc_stream import iter_update_messages
from rlrun.common.weights.ipc import IpcWeightBroadcaster, StagingBuffer, ipc_header
from rlrun.common.weights.protocol import tensor_specs
from rlrun.common.wire.weights import NcclRendezvous, WeightUpdateHeader, header_to_proto
from rlrun.trainer.weight_sync import measure_sync
from rlrun.v1 import inference_pb2, sampling_pb2, weights_pb2

from .conftest import other_weights

GREEDY = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=12)
SETTINGS = BroadcastConfig(retries=1, timeout_s=60)


async def greedy_tokens(stub) -> list[int]:
    request = inference_pb2.GenerateRequest(prompt_token_ids=[4, 20, 21, 22, 1, 5], sampling=GREEDY)
    return list((await stub.Generate(request)).completions[0].token_ids)


async def served_version(stub) -> int:
    return (await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())).policy_version


def make_broadcaster(kind: str, address: str):
    if kind == "ipc":
        return IpcWeightBroadcaster([address], SETTINGS, ClientOptions())
    return CollectiveWeightBroadcaster([address], SETTINGS, ClientOptions(), host="127.0.0.1", backend="gloo")


@pytest.mark.parametrize("kind", ["ipc", "gloo"])
async def test_an_update_reaches_the_engine_process_and_generate_serves_it(service, kind):
    config = service.service.config
    original, other = other_weights(config, config.model.seed), other_weights(config, seed=9)
    before = await greedy_tokens(service.stub)
    broadcaster = make_broadcaster(kind, service.address)
    try:
        (result,) = await broadcaster.broadcast(other, 1)
        assert result.ok, result.error
        assert result.bytes == sum(t.nbytes for t in other.values()) and result.seconds > 0
        assert await served_version(service.stub) == 1
        fetched = await greedy_tokens(service.stub)
        assert fetched != before
        # The same weights over the gRPC stream generate the same tokens.
        await service.stub.UpdateWeights(iter_update_messages(original, 2, 1 << 20))
        assert await greedy_tokens(service.stub) == before
        await service.stub.UpdateWeights(iter_update_messages(other, 3, 1 << 20))
        assert await greedy_tokens(service.stub) == fetched
        # Again over the kept buffer (IPC) or group (gloo): the original weights come back.
        (result,) = await broadcaster.broadcast(original, 4)
        assert result.ok, result.error
        assert await greedy_tokens(service.stub) == before
        assert await served_version(service.stub) == 4
    finally:
        await broadcaster.close()
    if kind == "ipc":
        assert broadcaster.staging is not None  # never retired: every update succeeded
    else:
        assert broadcaster.generation == 1


def _wrong_offset(header: weights_pb2.WeightUpdateHeader) -> str:
    header.ipc.offsets[1] = header.ipc.offsets[0] + 2  # inside the first tensor
    return "header.ipc.offsets[1]"


def _wrong_shape(header: weights_pb2.WeightUpdateHeader) -> str:
    header.tensors[0].shape[0] += 1
    return "header.tensors[0].shape"


def _unknown_object(header: weights_pb2.WeightUpdateHeader) -> str:
    header.ipc.shared_memory.name = "/torch_1_2_3"  # well formed, but nobody made it
    header.ipc.buffer_id = "gone"
    return "header.ipc"


def _not_a_torch_object(header: weights_pb2.WeightUpdateHeader) -> str:
    header.ipc.shared_memory.name = "/../etc/passwd"
    return "header.ipc.shared_memory.name"


def _too_small(header: weights_pb2.WeightUpdateHeader) -> str:
    header.ipc.size_bytes *= 2
    header.ipc.buffer_id = "bigger"
    return "header.ipc.size_bytes"


@pytest.mark.parametrize(
    "damage", [_wrong_offset, _wrong_shape, _unknown_object, _not_a_torch_object, _too_small]
)
async def test_a_failed_ipc_update_changes_nothing(service, damage):
    config = service.service.config
    before = await greedy_tokens(service.stub)
    staging = StagingBuffer(
        tuple((n, t.dtype, tuple(t.shape)) for n, t in other_weights(config, 9).items()), torch.device("cpu")
    )
    staging.stage(other_weights(config, seed=9))
    header = header_to_proto(ipc_header(staging, 1))
    field = damage(header)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await service.stub.UpdateWeights(iter([weights_pb2.WeightUpdateMessage(header=header)]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(field), caught.value.details()
    assert await greedy_tokens(service.stub) == before
    assert await served_version(service.stub) == 0
    # The replica is fine: the undamaged update of the same buffer goes through.
    await service.stub.UpdateWeights(
        iter([weights_pb2.WeightUpdateMessage(header=header_to_proto(ipc_header(staging, 1)))])
    )
    assert await greedy_tokens(service.stub) != before
    assert await served_version(service.stub) == 1


async def test_a_torch_replica_refuses_a_vllm_collective_and_reports_what_it_takes(service):
    tensors = other_weights(service.service.config, 9)
    header = header_to_proto(
        WeightUpdateHeader(
            version=1,
            tensors=tensor_specs(tensors),
            total_bytes=sum(t.nbytes for t in tensors.values()),
            transport="nccl",
            nccl=NcclRendezvous("127.0.0.1", 1, 2, 1, "", "pynccl"),
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await service.stub.UpdateWeights(iter([weights_pb2.WeightUpdateMessage(header=header)]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("header.nccl.backend")
    info = (await service.stub.GetStatus(inference_pb2.GetInferenceStatusRequest())).weight_sync
    assert info.device == "cpu" and info.node_id
    assert weights_pb2.WEIGHT_TRANSPORT_IPC in info.transports
    assert list(info.backends) == [weights_pb2.COLLECTIVE_BACKEND_TORCH_GLOO]


@pytest.mark.parametrize("transport", ["ipc", "nccl", "auto"])
async def test_measure_sync_times_each_round_to_a_served_replica(service, transport):
    tensors = other_weights(service.service.config, seed=9)
    results = await measure_sync(service.address, tensors, transport, rounds=2)
    assert [r.bytes for r in results] == [sum(t.nbytes for t in tensors.values())] * 2
    assert all(r.seconds > 0 for r in results)
    assert await served_version(service.stub) == 2


@pytest.mark.parametrize("transport", ["ipc", "nccl"])
async def test_a_refused_update_fails_at_once_and_names_the_replicas_error(service, transport):
    tensors = other_weights(service.service.config, seed=9)
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=f"over {transport} failed: .*header.tensors"):
        await measure_sync(service.address, dict(list(tensors.items())[1:]), transport, rounds=1)
    # The trainer's side of the collective does not wait out its timeout for a replica that
    # refused the header and will never join.
    assert time.perf_counter() - started < 30
