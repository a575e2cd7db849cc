"""Asks a run's orchestrator for its status (`rlrun.v1.OrchestratorService.GetStatus`)."""

from __future__ import annotations

import base64
import hashlib
import tempfile
from pathlib import Path
from typing import Any

from rlrun.operator.status import OrchestratorReport

_TLS_KEYS = ("ca.crt", "tls.crt", "tls.key")


def _open_channel(address: str, options: Any):
    from rlrun.common.grpc_client import open_channel

    return open_channel(address, options)


async def fetch_status(address: str, timeout_s: float = 3.0, options: Any = None) -> OrchestratorReport:
    """One GetStatus call with a short deadline and no retries. Raises grpc.aio.AioRpcError (or
    OSError for unreadable TLS files) when the orchestrator does not answer."""
    from rlrun.common.grpc_client import ClientOptions
    from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc

    options = options or ClientOptions(deadline_s=timeout_s, retries=1)
    channel = _open_channel(address, options)
    try:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
        response = await stub.GetStatus(orchestrator_pb2.GetRunStatusRequest(), timeout=timeout_s)
    finally:
        await channel.close()
    return OrchestratorReport.from_proto(response)


def client_options(
    timeout_s: float,
    tls_secret: dict[str, Any] | None = None,
    token_secret: dict[str, Any] | None = None,
    token_key: str = "token",
    workdir: Path | None = None,
) -> Any:
    """ClientOptions for a run whose services use TLS and/or a bearer token, from the run's
    Secrets (as read from the API). The operator presents the run's own certificate, which
    also satisfies servers that require client certificates."""
    from rlrun.common.grpc_client import ClientOptions

    kwargs: dict[str, Any] = {"deadline_s": timeout_s, "retries": 1}
    if tls_secret is not None:
        data = tls_secret.get("data") or {}
        digest = hashlib.sha256(repr(sorted(data.items())).encode()).hexdigest()[:16]
        folder = (workdir or Path(tempfile.gettempdir())) / f"rlrun-tls-{digest}"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for key in _TLS_KEYS:
            if key in data:
                path = folder / key
                path.write_bytes(base64.b64decode(data[key]))
                path.chmod(0o600)
        if (folder / "ca.crt").exists():
            kwargs["tls_ca"] = folder / "ca.crt"
        if (folder / "tls.crt").exists() and (folder / "tls.key").exists():
            kwargs["tls_cert"] = folder / "tls.crt"
            kwargs["tls_key"] = folder / "tls.key"
    if token_secret is not None:
        raw = (token_secret.get("data") or {}).get(token_key)
        if raw:
            kwargs["auth_token"] = base64.b64decode(raw).decode().strip()
    return ClientOptions(**kwargs)
