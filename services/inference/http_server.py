"""The OpenAI-compatible HTTP server of the inference service: rlrun.common.http_server's,
inside the service's own asyncio loop (the gRPC server owns SIGTERM), with the API key.

One credential for every port of a service: the HTTP API asks for what the gRPC port asks
for. Its key is `inference.api_key_file`, or else the service's gRPC bearer token
(`grpc.auth_token_file`), so a service with a token never answers HTTP without a credential;
every request must then carry `Authorization: Bearer <key>`, as vLLM's `--api-key` asks.
/health and /metrics stay open, so that probes and scrapes need no credentials (they disclose
no generations and change nothing). Its TLS pair is `inference.http_tls_cert` /
`http_tls_key`, or else the gRPC port's (`grpc.tls.cert` / `key`): TLS on one port means TLS
on the other.
"""

from __future__ import annotations

import hmac
import json
import socket
from pathlib import Path
from typing import Any

from rlrun.common import http_server
from rlrun.common.config import RunConfig
from rlrun.common.grpc_server import read_token_file

OPEN_PATHS = frozenset({"/health", "/metrics"})
"""Paths served without the API key."""


class ApiKeyMiddleware:
    """ASGI middleware: a request without `Authorization: Bearer <api_key>` gets 401 with an
    OpenAI-style error body (the `openai` client raises AuthenticationError on it)."""

    def __init__(self, app: Any, api_key: str) -> None:
        if not api_key.strip():
            raise ValueError("the API key must not be blank")
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = [value for name, value in scope["headers"] if name == b"authorization"]
        # Constant-time comparison: the key must not leak through response timing.
        if len(given) == 1 and hmac.compare_digest(given[0], self._expected):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {
                "error": {
                    "message": "missing or invalid API key (Authorization: Bearer <key>)",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def http_security(config: RunConfig) -> dict[str, Any]:
    """HttpServer's keyword arguments from a run file: the API key (`inference.api_key_file`,
    else the gRPC token) and the TLS pair (the HTTP one, else the gRPC one)."""
    inference, grpc = config.inference, config.grpc
    if inference.http_tls_cert is not None:
        tls_cert, tls_key = inference.http_tls_cert, inference.http_tls_key
    else:
        tls_cert, tls_key = grpc.tls.cert, grpc.tls.key
    return {
        "api_key": read_token_file(inference.api_key_file or grpc.auth_token_file),
        "tls_cert": tls_cert,
        "tls_key": tls_key,
    }


class HttpServer(http_server.HttpServer):
    """The common server, behind ApiKeyMiddleware when an API key is given."""

    def __init__(
        self,
        app,
        listener: socket.socket,
        *,
        api_key: str | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
    ):
        super().__init__(
            app if api_key is None else ApiKeyMiddleware(app, api_key),
            listener,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
