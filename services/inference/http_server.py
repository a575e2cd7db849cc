"""Serves an ASGI app with uvicorn inside the service's own asyncio loop.

The socket is bound by the caller before the service starts anything (and before uvicorn
starts), so a taken port fails at once and the port (0 = OS-assigned) is known.
uvicorn's own signal capture is turned off: the gRPC server owns SIGTERM and shuts this
server down as part of the service's cleanup.

With an API key (`inference.api_key_file`) every request must carry `Authorization: Bearer
<key>`, as vLLM's `--api-key` asks; /health and /metrics stay open, so that probes and scrapes
need no credentials (they disclose no generations and change nothing). With a certificate and
key (`inference.http_tls_cert` / `http_tls_key`) it serves HTTPS.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import socket
from pathlib import Path
from typing import Any

import uvicorn

from rlrun.common.grpc_server import read_token_file

KEEP_ALIVE_S = 65
"""Seconds an idle keep-alive connection stays open on the server's side."""
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


def http_security(inference_config: Any) -> dict[str, Any]:
    """HttpServer's keyword arguments from an `[inference]` config: the API key read from
    `api_key_file`, and the TLS pair."""
    return {
        "api_key": read_token_file(inference_config.api_key_file),
        "tls_cert": inference_config.http_tls_cert,
        "tls_key": inference_config.http_tls_key,
    }


class _QuietSignals(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield


class HttpServer:
    """Serves `app` on `listener`, a socket bound by rlrun.common.ports.listen_socket (the
    service binds its ports before it starts anything)."""

    def __init__(
        self,
        app,
        listener: socket.socket,
        *,
        api_key: str | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
    ):
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        if api_key is not None:
            app = ApiKeyMiddleware(app, api_key)
        self._socket = listener
        self.host, self.port = listener.getsockname()[:2]
        self.scheme = "https" if tls_cert is not None else "http"
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
            # Longer than a client pool keeps an idle connection (httpx: 5 s), so the client
            # always closes it first: at uvicorn's 5 s both ends raced, and a request sent on a
            # connection the server was closing failed ("Connection error" in verifiers' train
            # client, a retried group).
            timeout_keep_alive=KEEP_ALIVE_S,
            ssl_certfile=str(tls_cert) if tls_cert is not None else None,
            ssl_keyfile=str(tls_key) if tls_key is not None else None,
        )
        self._server = _QuietSignals(config)
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    async def start(self) -> None:
        """Returns once the server accepts connections."""
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what made uvicorn exit
                raise RuntimeError("the HTTP server exited during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is None:
            self._socket.close()
            return
        self._server.should_exit = True
        await self._task
        self._task = None
        self._socket.close()
