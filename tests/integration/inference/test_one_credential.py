"""One credential for every port: `rlrun serve inference` (a real process) with a gRPC bearer
token and its OpenAI HTTP port on, and no HTTP key of its own. The real `openai` client without
a credential, or with a wrong one, is refused on the HTTP port; with the service's token it is
answered; /health stays open to probes (metrics have a port of their own). The gRPC port asks
for the same token, and its health service none."""

from __future__ import annotations

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlrun.bench.services import free_port, start_service, stop_service
from rlrun.v1 import inference_pb2, inference_pb2_grpc

from .conftest import REPO

CONFIG = REPO / "configs/reverse_text.toml"
TOKEN = "run-token-3f9a1c"


@pytest.fixture
async def protected(tmp_path):
    token_file = tmp_path / "auth-token"
    token_file.write_text(TOKEN + "\n")
    http_port = free_port()
    process, address = await start_service(
        "inference",
        CONFIG,
        tmp_path,
        "--http-port",
        str(http_port),
        overrides=[f'grpc.auth_token_file="{token_file}"'],
    )
    yield address, f"http://127.0.0.1:{http_port}"
    await stop_service(process)


async def test_the_http_port_asks_for_the_grpc_token(protected):
    address, url = protected
    wrong = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        await wrong.completions.create(model="reverse_text", prompt="abc", max_tokens=2)
    assert refused.value.status_code == 401
    async with httpx.AsyncClient() as http:  # no Authorization header at all
        bare = {"model": "reverse_text", "prompt": "abc", "max_tokens": 2}
        assert (await http.post(f"{url}/v1/completions", json=bare)).status_code == 401
        assert (await http.get(f"{url}/v1/models")).status_code == 401
        assert (await http.get(f"{url}/health")).status_code == 200

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
    answer = await client.completions.create(model="reverse_text", prompt="abc", max_tokens=2)
    assert len(answer.choices) == 1

    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetStatus(inference_pb2.GetInferenceStatusRequest(), timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = await stub.GetStatus(
            inference_pb2.GetInferenceStatusRequest(),
            timeout=30,
            metadata=[("authorization", f"Bearer {TOKEN}")],
        )
        assert reply.policy_version == 0
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
