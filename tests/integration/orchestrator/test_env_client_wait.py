"""The orchestrator's RunGroup waits out an env-server that is gone (restarting on its port,
as Kubernetes or rlrun local restarts it), but takes an UNAVAILABLE that a live env-server
answers as that server's verdict on the group (the scheduler's retry policy decides)."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from rlrun.common.grpc_client import ClientOptions
from rlrun.common.wire.plan import GenerationPlan
from rlrun.common.wire.trace import TaskRef
from rlrun.orchestrator.collect.env_client import EnvClient
from rlrun.v1 import env_pb2, env_pb2_grpc


class Env(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, answer: grpc.StatusCode):
        self.answer = answer
        self.run_groups = 0

    async def GetInfo(self, request, context):
        return env_pb2.GetInfoResponse()

    async def RunGroup(self, request, context):
        self.run_groups += 1
        await context.abort(self.answer, "the env's own answer")


async def serve(env: Env, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    env_pb2_grpc.add_EnvServiceServicer_to_server(env, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_group(client: EnvClient):
    return client.run_group("g-1", TaskRef(env="e", split="train", idx=0), GenerationPlan({}), 1, 30.0)


async def test_a_gone_env_server_is_waited_for_until_it_is_back():
    port = unused_port()
    client = EnvClient(f"127.0.0.1:{port}", ClientOptions(retries=1), unavailable_retry_s=30.0)
    restarted = Env(grpc.StatusCode.INVALID_ARGUMENT)
    try:
        call = asyncio.create_task(run_group(client))
        await asyncio.sleep(1.5)
        server, _ = await serve(restarted, port)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(call, 30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # it reached the new server
        assert restarted.run_groups == 1
        await server.stop(0)
    finally:
        await client.close()


async def test_a_live_env_servers_own_unavailable_is_raised_at_once():
    env = Env(grpc.StatusCode.UNAVAILABLE)
    server, port = await serve(env)
    client = EnvClient(f"127.0.0.1:{port}", ClientOptions(retries=1), unavailable_retry_s=30.0)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await run_group(client)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert env.run_groups == 1 and time.monotonic() - started < 10
    finally:
        await client.close()
        await server.stop(0)
