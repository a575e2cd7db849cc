"""Asks a run's orchestrator for its status (`rlrun.v1.OrchestratorService.GetStatus`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlrun.common.wire.orchestrator import RunStatus, status_from_proto, status_request


def _open_channel(address: str, options: Any):
    from rlrun.common.grpc_client import open_channel

    return open_channel(address, options)


async def fetch_status(address: str, timeout_s: float = 3.0, options: Any = None) -> RunStatus:
    """One GetStatus call with a short deadline and no retries. Raises grpc.aio.AioRpcError (or
    OSError for unreadable TLS files) when the orchestrator does not answer."""
    from rlrun.common.grpc_client import ClientOptions
    from rlrun.v1 import orchestrator_pb2_grpc

    options = options or ClientOptions(deadline_s=timeout_s, retries=1)
    channel = _open_channel(address, options)
    try:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
        return status_from_proto(await stub.GetStatus(status_request(), timeout=timeout_s))
    finally:
        await channel.close()


def client_options(
    timeout_s: float,
    token: str,
    *,
    tls: bool = False,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> Any:
    """ClientOptions for the status poll of a run: its bearer token, and with `tls` the
    operator's own CA and client certificate (the operator reads none of the run's Secrets).
    Raises ValueError for a TLS run when the operator has no CA."""
    from rlrun.common.grpc_client import ClientOptions

    kwargs: dict[str, Any] = {"deadline_s": timeout_s, "retries": 1, "auth_token": token}
    if tls:
        if ca is None:
            raise ValueError(
                "the run uses TLS (spec.secrets.tls) and the operator has no CA to check it "
                "(rlrun operator --grpc-tls-ca; chart value grpcTls.caSecret)"
            )
        kwargs["tls_ca"] = ca
        if cert is not None and key is not None:
            kwargs["tls_cert"], kwargs["tls_key"] = cert, key
    return ClientOptions(**kwargs)
