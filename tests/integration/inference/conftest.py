"""The inference service on 127.0.0.1 (port 0), in this process, driven by real clients."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rlrun.common.config import RunConfig, load_config
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.common.model import build_model
from rlrun.common.weights.protocol import broadcast_tensors
from rlrun.inference.service import InferenceService
from rlrun.inference.servicer import SERVICE_NAME
from rlrun.v1 import inference_pb2_grpc

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "support"))  # the shared test helpers


def run_config(tmp_path: Path, *overrides: str) -> RunConfig:
    return load_config(REPO / "configs/reverse_text.toml", [f'output_dir="{tmp_path}"', *overrides])


def other_weights(config: RunConfig, seed: int) -> dict[str, torch.Tensor]:
    """Weights of the same architecture from another seed."""
    return broadcast_tensors(build_model(config.model.model_copy(update={"seed": seed})))


class RunningService:
    def __init__(self, service: InferenceService, server: GrpcServer):
        self.service = service
        self.server = server
        self.address = server.address
        self.channel = open_channel(self.address, ClientOptions(deadline_s=30))
        self.stub = inference_pb2_grpc.InferenceServiceStub(self.channel)

    @property
    def http_url(self) -> str:
        return self.service.http.url

    async def close(self) -> None:
        await self.channel.close()
        await self.server.stop(0)
        await self.service.stop()


@pytest.fixture
async def start_service(tmp_path):
    """Starts a service: start_service(*config_overrides, require_version=None, http=True)."""
    running: list[RunningService] = []

    async def start(*overrides: str, require_version: int | None = None, http: bool = True) -> RunningService:
        config = run_config(tmp_path, *overrides)
        server = GrpcServer(ServerOptions(host="127.0.0.1", port=0, shutdown_grace_s=0), [SERVICE_NAME])
        service = InferenceService(
            config, server, http_port=0 if http else None, require_version=require_version
        )
        await service.start()
        await server.start()
        running.append(RunningService(service, server))
        return running[-1]

    yield start
    for item in running:
        await item.close()


@pytest.fixture
async def service(start_service) -> RunningService:
    return await start_service()
