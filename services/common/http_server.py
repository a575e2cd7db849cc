"""Serves an ASGI app with uvicorn inside the caller's asyncio loop (the inference service's
OpenAI-compatible API, `rlrun dashboard`).

The caller binds the socket (rlrun.common.ports.listen_socket) before it starts anything, so a
taken port fails at once, naming what sets it, and the port (0 = OS-assigned) is known.
uvicorn's own signal capture is turned off: the caller owns SIGTERM and shuts this server down
as part of its cleanup. With a certificate and key it serves HTTPS.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import uvicorn


class _QuietSignals(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield


KEEP_ALIVE_S = 65
"""Seconds an idle keep-alive connection stays open on the server's side."""


class HttpServer:
    """Serves `app` on `listener`, a socket bound by rlrun.common.ports.listen_socket."""

    def __init__(
        self,
        app,
        listener: socket.socket,
        *,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
    ):
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
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
