"""Fixtures for the trainer's integration tests: test-only inference replicas that receive weight
updates (a gRPC chunk stream, or the collective protocol over gloo), a dead replica address,
and an in-process trainer server."""

from __future__ import annotations

import asyncio
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
import torch

from rlrun.common import builtin
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.common.model import build_model
from rlrun.common.weights.groups import join_weight_group
from rlrun.common.weights.grpc_stream import WeightAssembler
from rlrun.common.weights.protocol import TensorLayout, broadcast_tensors, torch_dtype
from rlrun.common.wire.weights import WeightUpdateHeader, update_message_from_proto
from rlrun.trainer.app import add_trainer_service, create_runtime
from rlrun.trainer.coordinator import Coordinator
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner
from rlrun.trainer.servicer import SERVICE_NAME
from rlrun.trainer.synthetic import synthetic_config
from rlrun.v1 import inference_pb2, inference_pb2_grpc, trainer_pb2_grpc

torch.set_num_threads(1)

INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


class RecordingInference(inference_pb2_grpc.InferenceServiceServicer):
    """Receives weight updates as a replica would and keeps the last one. gRPC transport:
    WeightAssembler against the model's own tensors. Collective transport: joins the header's
    group (`backend` gloo on CPU stands in for NCCL; nccl needs `device` = a GPU) and receives
    every tensor in header order."""

    __test__ = False

    def __init__(
        self, expected: dict[str, torch.Tensor], backend: str = "gloo", device: str = "cpu", ranks: int = 1
    ):
        self.expected = expected
        self.backend = backend
        self.device = torch.device(device)
        self.ranks = ranks
        """Workers joining the collective (tensor parallelism), from the header's rank on."""
        self.version = 0
        self.weights: dict[str, torch.Tensor] = {}
        self.updates = 0
        self.rollbacks = 0
        """Updates marked as a rollback (an older version allowed)."""
        self.groups: dict[tuple, object] = {}
        """Joined groups by (host, port, world_size, rank, group_name)."""

    def _receive_on_rank(self, header: WeightUpdateHeader, worker: int) -> dict[str, torch.Tensor]:
        rendezvous = header.nccl
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        rank = rendezvous.rank + worker
        key = (rendezvous.host, rendezvous.port, rendezvous.world_size, rank, rendezvous.group_name)
        if key not in self.groups:
            self.groups[key] = join_weight_group(
                self.backend,
                rendezvous.host,
                rendezvous.port,
                rank,
                rendezvous.world_size,
                self.device,
                timedelta(seconds=30),
            )
        tensors = {}
        for spec in header.tensors:
            tensor = torch.empty(tuple(spec.shape), dtype=torch_dtype(spec.dtype), device=self.device)
            self.groups[key].broadcast(tensor)
            tensors[spec.name] = tensor
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return {name: tensor.cpu() for name, tensor in tensors.items()}

    def _receive_collective(self, header: WeightUpdateHeader) -> dict[str, torch.Tensor]:
        with ThreadPoolExecutor(self.ranks) as workers:
            received = list(
                workers.map(lambda worker: self._receive_on_rank(header, worker), range(self.ranks))
            )
        for other in received[1:]:
            assert all(torch.equal(other[name], received[0][name]) for name in received[0])
        return received[0]

    async def UpdateWeights(self, request_iterator, context):
        header, assembler, tensors = None, None, None
        async for message in request_iterator:
            received = update_message_from_proto(message)
            if isinstance(received, WeightUpdateHeader):
                header = received
                if header.transport == "nccl":
                    tensors = await asyncio.to_thread(self._receive_collective, header)
                else:
                    assembler = WeightAssembler(header, TensorLayout(header.tensors, self.expected))
            else:
                assembler.add(received)
        self.weights = tensors if tensors is not None else assembler.finish()
        self.version = header.version
        self.rollbacks += header.rollback
        self.updates += 1
        return inference_pb2.UpdateWeightsResponse(version=header.version, bytes_received=header.total_bytes)

    async def GetStatus(self, request, context):
        return inference_pb2.GetInferenceStatusResponse(policy_version=self.version)


@pytest.fixture
def dead_address() -> str:
    """An address nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class Replica:
    address: str
    servicer: RecordingInference
    server: GrpcServer


@pytest.fixture
async def start_replica(tmp_path):
    """start_replica(model="tiny-d64", backend="gloo", device="cpu", ranks=1, lora=None) -> a
    running RecordingInference on 127.0.0.1 (`lora`: a `[trainer.lora]` table; it takes the
    adapters alone)."""
    replicas: list[Replica] = []

    async def start(
        model: str = "tiny-d64",
        backend: str = "gloo",
        device: str = "cpu",
        ranks: int = 1,
        lora: dict | None = None,
    ) -> Replica:
        server = GrpcServer(ServerOptions(shutdown_grace_s=0), [INFERENCE])
        config = synthetic_config(tmp_path, model=model, trainer={"lora": lora} if lora else None)
        expected = broadcast_tensors(build_model(config.model, lora=config.trainer.lora))
        servicer = RecordingInference(expected, backend, device, ranks)
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, server.server)
        port = await server.start()
        server.set_serving(True)
        replica = Replica(f"127.0.0.1:{port}", servicer, server)
        replicas.append(replica)
        return replica

    yield start
    for replica in replicas:
        await replica.server.stop(0)


@dataclass
class TrainerUnderTest:
    stub: trainer_pb2_grpc.TrainerServiceStub
    runtime: object
    learner: object
    config: object


@pytest.fixture
async def start_trainer(tmp_path):
    """start_trainer(addresses, **trainer_overrides) -> an in-process TrainerService on 127.0.0.1."""
    started: list[tuple[GrpcServer, object, grpc.aio.Channel]] = []

    async def start(addresses: list[str], **trainer) -> TrainerUnderTest:
        trainer.setdefault("broadcast", {"retries": 1})
        config = synthetic_config(tmp_path, trainer=trainer, inference_addresses=addresses)
        learner = build_learner(config, Parallelism.single())
        runtime = create_runtime(config, Coordinator(learner, None), ClientOptions())
        server = GrpcServer(ServerOptions(shutdown_grace_s=0), [SERVICE_NAME])
        add_trainer_service(server.server, runtime, config)
        port = await server.start()
        server.set_serving(True)
        channel = open_channel(f"127.0.0.1:{port}", ClientOptions(deadline_s=60))
        started.append((server, runtime, channel))
        return TrainerUnderTest(trainer_pb2_grpc.TrainerServiceStub(channel), runtime, learner, config)

    yield start
    for server, runtime, channel in started:
        await channel.close()
        await runtime.broadcaster.close()
        await server.stop(0)


@pytest.fixture
def write_run_file():
    """write_run_file(path, output_dir, addresses, trainer) -> a TOML run file for a trainer
    subprocess (tiny-d64, the given [trainer] settings)."""
    return _write_run_file


def _write_run_file(path: Path, output_dir: Path, addresses: list[str], trainer: dict) -> Path:
    lines = [
        f"output_dir = {json.dumps(str(output_dir))}",
        "[model]",
        f"config = {json.dumps(str(builtin.model_config('tiny-d64')))}",
        f"tokenizer = {json.dumps(str(builtin.tokenizer('char')))}",
        "[inference]",
        f"addresses = {json.dumps(addresses)}",
        "[trainer]",
        *(f"{key} = {json.dumps(value)}" for key, value in trainer.items()),
        "[[orchestrator.train.env]]",
        'id = "reverse-text"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
