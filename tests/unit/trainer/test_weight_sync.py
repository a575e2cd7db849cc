"""Which weight transport `trainer.broadcast.transport` builds, and which one "auto" picks for
each replica from what it reports."""

from __future__ import annotations

import pytest
import torch

from rlrun.common import builtin
from rlrun.common.config import resolve_config
from rlrun.common.config.deprecations import ConfigError
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.weights.collective import CollectiveWeightBroadcaster
from rlrun.common.weights.grpc_stream import GrpcWeightBroadcaster
from rlrun.common.weights.ipc import IpcWeightBroadcaster
from rlrun.common.wire.weights import sync_info_from_proto
from rlrun.inference.engines.vllm_engine import VllmEngine
from rlrun.trainer.weight_sync import AutoWeightBroadcaster, choose_transport, make_broadcaster
from rlrun.v1 import weights_pb2 as pb

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")
NODE = "host/boot/ipc:[1]"
TORCH_ON = {
    "transports": [pb.WEIGHT_TRANSPORT_GRPC, pb.WEIGHT_TRANSPORT_IPC, pb.WEIGHT_TRANSPORT_NCCL],
    "backends": [pb.COLLECTIVE_BACKEND_TORCH_GLOO, pb.COLLECTIVE_BACKEND_TORCH_NCCL],
}


def config(tmp_path, transport: str, engine: str = "torch", device: str = "cpu", tensor_parallel: int = 1):
    run, _ = resolve_config(
        {
            "output_dir": str(tmp_path),
            "model": {
                "config": str(builtin.model_config("tiny-d64")),
                "tokenizer": str(builtin.tokenizer("char")),
            },
            "inference": {
                "addresses": ["127.0.0.1:1"],
                "engine": engine,
                "vllm": {"tensor_parallel_size": tensor_parallel},
            },
            "trainer": {"device": device, "broadcast": {"transport": transport}},
            "orchestrator": {"train": {"env": [{"id": "reverse-text"}]}},
        }
    )
    return run


@pytest.mark.parametrize(
    ("trainer", "replica", "expected"),
    [
        # A CPU trainer always streams over gRPC, whatever the replica could do.
        (CPU, pb.WeightSyncInfo(node_id=NODE, device="cpu", **TORCH_ON), "grpc"),
        (CPU, pb.WeightSyncInfo(node_id=NODE, device="cuda:0", **TORCH_ON), "grpc"),
        (CUDA, pb.WeightSyncInfo(node_id=NODE, device="cuda:1", **TORCH_ON), "ipc"),
        (CUDA, pb.WeightSyncInfo(node_id="other/boot/ipc:[1]", device="cuda:0", **TORCH_ON), "nccl"),
        # A CPU replica beside a CUDA trainer: no CUDA IPC, no NCCL.
        (CUDA, pb.WeightSyncInfo(node_id=NODE, device="cpu", **TORCH_ON), "grpc"),
        (
            CUDA,
            pb.WeightSyncInfo(
                transports=[pb.WEIGHT_TRANSPORT_GRPC, pb.WEIGHT_TRANSPORT_NCCL],
                backends=[pb.COLLECTIVE_BACKEND_PYNCCL],
            ),
            "pynccl",
        ),
        # A replica that says nothing (an older one): the stream.
        (CUDA, pb.WeightSyncInfo(), "grpc"),
    ],
)
def test_auto_picks_a_transport_per_replica(trainer, replica, expected):
    assert choose_transport(trainer, NODE, sync_info_from_proto(replica)) == expected


async def test_each_transport_builds_its_broadcaster(tmp_path):
    built = {
        ("grpc", "torch"): GrpcWeightBroadcaster,
        ("auto", "torch"): GrpcWeightBroadcaster,  # auto on a CPU trainer
        ("ipc", "torch"): IpcWeightBroadcaster,
        ("nccl", "torch"): CollectiveWeightBroadcaster,
        ("nccl", "vllm"): CollectiveWeightBroadcaster,
    }
    for (transport, engine), kind in built.items():
        broadcaster = make_broadcaster(
            config(tmp_path, transport, engine, tensor_parallel=2), ClientOptions()
        )
        try:
            assert type(broadcaster) is kind, (transport, engine)
            if kind is CollectiveWeightBroadcaster:
                # The torch engine joins a torch.distributed group (gloo from a CPU trainer);
                # vLLM joins its own communicator, one rank per tensor-parallel worker.
                expected = ("gloo", 1) if engine == "torch" else ("pynccl", 2)
                assert (broadcaster.backend, broadcaster.ranks_per_replica) == expected
        finally:
            await broadcaster.close()
    auto = make_broadcaster(config(tmp_path, "auto", device="cuda"), ClientOptions())
    try:
        assert isinstance(auto, AutoWeightBroadcaster) and not auto.tensors_on_cpu
        assert auto.by_transport["nccl"].backend == "nccl"
        assert auto.by_transport["pynccl"].backend == "pynccl"
    finally:
        await auto.close()


@pytest.mark.parametrize(
    ("transport", "engine", "message"),
    [
        ("ipc", "vllm", "trainer.broadcast.transport = 'ipc' needs inference.engine = 'torch'"),
        ("shm", "torch", "trainer.broadcast.transport"),
    ],
)
def test_a_transport_that_cannot_work_names_the_field(tmp_path, transport, engine, message):
    with pytest.raises(ConfigError) as caught:
        config(tmp_path, transport, engine)
    assert message in str(caught.value)


@pytest.mark.parametrize(("trainer", "expected"), [(CUDA, "pynccl"), (CPU, "grpc")])
def test_a_vllm_replica_beside_the_trainer_is_sent_vllms_communicator(tmp_path, trainer, expected):
    """vLLM's workers never map the trainer's buffer: on the trainer's own node too, "auto"
    picks the communicator they join (from what the engine itself reports)."""
    replica = VllmEngine(config(tmp_path, "auto", engine="vllm")).weight_sync_info()
    assert choose_transport(trainer, replica.node_id, replica) == expected
