"""An env-server's Generate outlives a replica that dies: a call answered UNAVAILABLE (refused
connection, or a restarted replica still waiting for the live weights) goes to another replica
at once, or to the same one once it is back, within grpc.unavailable_retry_s."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.sdk.errors import ModelCallError
from rlrun.env_server.sdk.inference_client import InferenceClient
from rlrun.v1 import inference_pb2, inference_pb2_grpc


class Replica(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, waiting_for_weights: bool = False):
        self.calls = 0
        self.waiting_for_weights = waiting_for_weights

    async def Generate(self, request, context):
        self.calls += 1
        if self.waiting_for_weights:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this replica waits for version 3")
        completion = inference_pb2.Completion(
            token_ids=[7], logprobs=[-0.5], finish_reason=inference_pb2.FINISH_REASON_STOP
        )
        return inference_pb2.GenerateResponse(
            completions=[completion], prompt_tokens=len(request.prompt_token_ids)
        )


async def serve(replica: Replica, port: int = 0) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(replica, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, f"127.0.0.1:{bound}"


def unused_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


PARAMS = SamplingParams(max_tokens=2)


async def test_a_call_to_a_dead_replica_goes_to_a_live_one():
    live = Replica()
    server, address = await serve(live)
    client = InferenceClient(unavailable_retry_s=5.0)
    try:
        for _ in range(4):  # ties rotate, so some calls pick the dead replica first
            [completion] = await client.generate([unused_address(), address], [3, 4], PARAMS)
            assert completion.token_ids == [7]
        assert live.calls == 4
    finally:
        await client.close()
        await server.stop(0)


async def test_a_replica_waiting_for_weights_is_skipped():
    waiting, live = Replica(waiting_for_weights=True), Replica()
    (s1, a1), (s2, a2) = await serve(waiting), await serve(live)
    client = InferenceClient(unavailable_retry_s=5.0)
    try:
        for _ in range(4):
            await client.generate([a1, a2], [3], PARAMS)
        assert live.calls == 4 and waiting.calls >= 1
    finally:
        await client.close()
        await asyncio.gather(s1.stop(0), s2.stop(0))


async def test_the_only_replica_is_waited_for_until_it_is_back():
    address = unused_address()
    client = InferenceClient(unavailable_retry_s=30.0)
    restarted = Replica()

    async def restart_later():
        await asyncio.sleep(1.5)  # a restart on the same port, as Kubernetes or rlrun local does
        return await serve(restarted, int(address.rsplit(":", 1)[1]))

    try:
        call = asyncio.create_task(client.generate([address], [3], PARAMS))
        server, _ = await restart_later()
        [completion] = await asyncio.wait_for(call, 30)
        assert completion.token_ids == [7] and restarted.calls == 1
        await server.stop(0)
    finally:
        await client.close()


async def test_a_replica_gone_for_good_fails_the_call_once_the_budget_is_spent():
    client = InferenceClient(unavailable_retry_s=1.0)
    try:
        with pytest.raises(ModelCallError) as caught:
            await asyncio.wait_for(client.generate([unused_address()], [3], PARAMS), 30)
        assert caught.value.code == "UNAVAILABLE" and caught.value.retryable
    finally:
        await client.close()
