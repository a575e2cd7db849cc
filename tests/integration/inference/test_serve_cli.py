"""`rlrun serve inference` as a process: the ready line, --require-version, SIGTERM, and a
dead engine process."""

import asyncio
import os
import signal

from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlrun.bench.services import start_service, stop_service
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.weights.grpc_stream import iter_update_messages
from rlrun.v1 import inference_pb2_grpc

from .conftest import REPO, other_weights, run_config

CONFIG = REPO / "configs/reverse_text.toml"


async def test_serve_waits_for_the_required_version_and_stops_on_sigterm(tmp_path):
    process, address = await start_service("inference", CONFIG, tmp_path, "--require-version", "1")
    try:
        async with open_channel(address, ClientOptions(deadline_s=30)) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            tensors = other_weights(run_config(tmp_path), seed=5)
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            await stub.UpdateWeights(list(iter_update_messages(tensors, 1)))
            reply = await health.Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=60) == 0
    finally:
        await stop_service(process)


def engine_process_of(pid: int) -> int:
    children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    for child in map(int, children):
        if "spawn_main" in open(f"/proc/{child}/cmdline").read():
            return child
    raise AssertionError(f"no engine process under {pid}: {children}")


async def test_a_replica_whose_engine_process_dies_stops_with_an_error(tmp_path):
    process, _ = await start_service("inference", CONFIG, tmp_path)
    try:
        os.kill(engine_process_of(process.pid), signal.SIGKILL)
        assert await asyncio.wait_for(process.wait(), timeout=60) == 1
        log = (tmp_path / "inference.log").read_text()
        assert "the engine process exited unexpectedly (exit code -9)" in log
    finally:
        await stop_service(process)
