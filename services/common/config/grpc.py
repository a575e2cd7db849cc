"""[grpc]: transport settings shared by every service and client."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rlrun.common.config.base import Section


class TlsConfig(Section):
    cert: Path | None = None
    """PEM certificate of this service. Setting cert and key turns on TLS. Default: unset."""

    key: Path | None = None
    """PEM private key for `cert`. Default: unset."""

    ca: Path | None = None
    """PEM CA bundle used by clients to verify servers (and by servers to verify clients when
    `require_client_cert`). Default: unset (system roots)."""

    require_client_cert: bool = False
    """Mutual TLS: servers reject clients without a certificate signed by `ca`. Default: false."""

    server_name: str | None = None
    """Overrides the host name clients check in the server certificate. Default: unset."""

    @model_validator(mode="after")
    def _pairs(self) -> TlsConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("grpc.tls.cert and grpc.tls.key must be set together")
        if self.require_client_cert and self.ca is None:
            raise ValueError("grpc.tls.require_client_cert needs grpc.tls.ca")
        return self


class GrpcConfig(Section):
    max_message_mb: int = Field(64, gt=0)
    """Largest message a server or client accepts or sends, in MiB. Default: 64."""

    deadline_s: float = Field(600.0, gt=0)
    """Deadline of a call that sets none of its own, in seconds. Default: 600."""

    retries: int = Field(4, ge=1, le=5)
    """Attempts per call on UNAVAILABLE (the channel's retry policy). Default: 4."""

    unavailable_retry_s: float = Field(120.0, gt=0)
    """How long a caller keeps retrying a service that is UNAVAILABLE (restarting, or its pod
    being rescheduled) before it gives up: the orchestrator's calls to the trainer, an
    env-server's Generate calls to inference. Longer than a pod reschedule. Default: 120."""

    shutdown_grace_s: float = Field(5.0, ge=0)
    """On SIGTERM, health goes NOT_SERVING and calls get this long to finish. Default: 5."""

    auth_token_file: Path | None = None
    """File holding a bearer token. Servers require it on every call (except health);
    clients send it. Default: unset (no auth)."""

    tls: TlsConfig = TlsConfig()
    """TLS settings. Default: plaintext."""
