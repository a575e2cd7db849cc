"""The OpenAI HTTP endpoint's API key and TLS (rlrun.inference.http_server), driven by the real
`openai` client: without the key (or with a wrong one) a request is refused with 401, with it
the app answers; /health and /metrics stay open without credentials."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from rlrun.common.config import RunConfig, load_config
from rlrun.common.config.inference import InferenceConfig
from rlrun.common.ports import listen_socket
from rlrun.inference.http_server import HttpServer, http_security

KEY = "sk-run-7f3a9c"
REPO = Path(__file__).resolve().parents[3]


def run_config(*overrides: str) -> RunConfig:
    return load_config(REPO / "configs/reverse_text.toml", list(overrides))


def _app() -> Starlette:
    async def models(request):
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": "policy", "object": "model", "created": 0, "owned_by": "rlrun"}],
            }
        )

    async def health(request):
        return PlainTextResponse("ok")

    async def metrics(request):
        return PlainTextResponse("rlrun_inference_up 1\n")

    return Starlette(
        routes=[Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)]
    )


@pytest.fixture
async def serve():
    servers: list[HttpServer] = []

    async def start(**security) -> HttpServer:
        server = HttpServer(_app(), listen_socket("127.0.0.1", 0, "the test app", "the test"), **security)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


async def test_the_openai_client_needs_the_api_key(serve, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    server = await serve(**http_security(run_config(f'inference.api_key_file="{key_file}"')))
    base = f"{server.url}/v1"

    with pytest.raises(openai.AuthenticationError) as refused:
        await openai.AsyncOpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    assert refused.value.status_code == 401
    assert refused.value.body["code"] == "invalid_api_key"
    async with httpx.AsyncClient() as http:
        bare = await http.get(f"{base}/models")
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
        # Probes and scrapes carry no credentials.
        assert (await http.get(f"{server.url}/health")).status_code == 200
        assert (await http.get(f"{server.url}/metrics")).text == "rlrun_inference_up 1\n"
        # Only the exact paths are open, not what merely starts like them.
        assert (await http.get(f"{server.url}/healthz")).status_code == 401

    client = openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0)
    assert [m.id for m in (await client.models.list()).data] == ["policy"]


async def test_its_own_key_wins_over_the_grpc_token(serve, tmp_path):
    (tmp_path / "api-key").write_text(KEY)
    (tmp_path / "token").write_text("the-grpc-token")
    config = run_config(
        f'inference.api_key_file="{tmp_path / "api-key"}"', f'grpc.auth_token_file="{tmp_path / "token"}"'
    )
    server = await serve(**http_security(config))
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="the-grpc-token", max_retries=0
        ).models.list()
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in (await client.models.list()).data] == ["policy"]


async def test_tls_on_the_grpc_port_means_tls_on_the_http_port(serve, pki):
    config = run_config(f'grpc.tls.cert="{pki.server_cert}"', f'grpc.tls.key="{pki.server_key}"')
    server = await serve(**http_security(config))
    assert server.url.startswith("https://")
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.ca)) as http:
        assert (await http.get(f"{server.url}/health")).status_code == 200


async def test_without_any_credential_the_endpoint_is_open(serve):
    server = await serve(**http_security(run_config()))
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="anything", max_retries=0)
    assert [m.id for m in (await client.models.list()).data] == ["policy"]


async def test_https_with_the_key(serve, pki):
    server = await serve(api_key=KEY, tls_cert=pki.server_cert, tls_key=pki.server_key)
    assert server.url.startswith("https://")
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.ca)) as http:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, http_client=http)
        assert [m.id for m in (await client.models.list()).data] == ["policy"]
        # Plain HTTP on the TLS port gets no answer from the app.
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://127.0.0.1:{server.port}/health")


def test_an_unpaired_certificate_or_blank_key_is_refused(pki):
    with pytest.raises(ValueError, match="inference.http_tls_cert and inference.http_tls_key"):
        InferenceConfig.model_validate({"http_tls_cert": str(pki.server_cert)})
    with (
        listen_socket("127.0.0.1", 0, "the test app", "the test") as listener,
        pytest.raises(ValueError, match="blank"),
    ):
        HttpServer(_app(), listener, api_key="  ")
