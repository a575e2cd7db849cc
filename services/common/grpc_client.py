"""gRPC client scaffolding shared by every rlrun service and tool (grpc.aio).

    channel = open_channel("127.0.0.1:50051", ClientOptions.from_config(cfg.grpc))
    await wait_for_health("127.0.0.1:50051", options)
    stub = inference_pb2_grpc.InferenceServiceStub(channel)

A channel from `open_channel`:
- retries UNAVAILABLE (the channel's service config; `retries` attempts in all, with backoff);
- speaks TLS when `tls_ca` or `tls_cert` is set, and presents a client certificate (mTLS)
  when `tls_cert`/`tls_key` are set;
- sends `authorization: Bearer <token>` on every call when `auth_token` is set (through a
  client interceptor, so it also works on plaintext loopback);
- gives every call that sets no timeout of its own the deadline `deadline_s`
  (unary and streaming calls alike).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlrun.common.grpc_server import AUTH_METADATA_KEY, read_token_file

if TYPE_CHECKING:
    from rlrun.common.config.grpc import GrpcConfig

__all__ = [
    "DEFAULT_DEADLINE_S",
    "ClientOptions",
    "UnavailableBackoff",
    "call_while_unavailable",
    "channel_options",
    "open_channel",
    "retry_service_config",
    "wait_for_health",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_DEADLINE_S: float = 600.0
# gRPC caps maxAttempts at 5; 1 means no retry.
MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class ClientOptions:
    deadline_s: float = DEFAULT_DEADLINE_S
    retries: int = 4  # attempts per call on UNAVAILABLE, the first one included
    max_message_bytes: int = 64 * 2**20
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    server_name: str | None = None
    auth_token: str | None = None

    def __post_init__(self) -> None:
        if self.deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        if self.retries < 1:
            raise ValueError("retries must be >= 1 (attempts, the first one included)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be set together")
        if self.max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be positive")

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    @classmethod
    def from_config(cls, grpc_cfg: GrpcConfig) -> ClientOptions:
        tls = grpc_cfg.tls
        return cls(
            deadline_s=grpc_cfg.deadline_s,
            retries=grpc_cfg.retries,
            max_message_bytes=grpc_cfg.max_message_mb * 2**20,
            tls_ca=tls.ca,
            tls_cert=tls.cert,
            tls_key=tls.key,
            server_name=tls.server_name,
            auth_token=read_token_file(grpc_cfg.auth_token_file),
        )


def retry_service_config(retries: int) -> dict:
    """The channel service config: round_robin over the target's addresses, and retry
    UNAVAILABLE, `retries` attempts in all."""
    attempts = max(1, min(int(retries), MAX_ATTEMPTS))
    method_config: dict = {"name": [{}]}
    if attempts >= 2:
        method_config["retryPolicy"] = {
            "maxAttempts": attempts,
            "initialBackoff": "0.1s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
    # round_robin spreads calls over every address the target resolves to: the pods behind a
    # headless Service (a `dns:///` target) or an `ipv4:a:p,b:q` list. With one address it
    # behaves as the default pick_first.
    return {"loadBalancingConfig": [{"round_robin": {}}], "methodConfig": [method_config]}


def channel_options(options: ClientOptions) -> list[tuple[str, object]]:
    result: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", options.max_message_bytes),
        ("grpc.max_receive_message_length", options.max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(retry_service_config(options.retries))),
    ]
    if options.server_name:
        result.append(("grpc.ssl_target_name_override", options.server_name))
    return result


class _CallDefaults:
    """Shared by the four interceptor kinds: default deadline and the bearer token."""

    def __init__(self, deadline_s: float, auth_token: str | None) -> None:
        self.deadline_s = deadline_s
        self.authorization = f"Bearer {auth_token}" if auth_token else None

    def apply(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        changes: dict = {}
        if details.timeout is None:
            changes["timeout"] = self.deadline_s
        if self.authorization is not None:
            pairs = [(k, v) for k, v in (details.metadata or ())]
            if not any(k.lower() == AUTH_METADATA_KEY for k, _ in pairs):
                pairs.append((AUTH_METADATA_KEY, self.authorization))
                changes["metadata"] = grpc.aio.Metadata(*pairs)
        return details._replace(**changes) if changes else details


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, defaults: _CallDefaults) -> None:
        self._defaults = defaults

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._defaults.apply(client_call_details), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, defaults: _CallDefaults) -> None:
        self._defaults = defaults

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._defaults.apply(client_call_details), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, defaults: _CallDefaults) -> None:
        self._defaults = defaults

    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._defaults.apply(client_call_details), request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, defaults: _CallDefaults) -> None:
        self._defaults = defaults

    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._defaults.apply(client_call_details), request_iterator)


def _credentials(options: ClientOptions) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=Path(options.tls_ca).read_bytes() if options.tls_ca else None,
        private_key=Path(options.tls_key).read_bytes() if options.tls_key else None,
        certificate_chain=Path(options.tls_cert).read_bytes() if options.tls_cert else None,
    )


def open_channel(address: str, options: ClientOptions = ClientOptions()) -> grpc.aio.Channel:
    """A grpc.aio channel to `address` ("host:port") with retries, TLS, auth and a default
    deadline as configured in `options` (see module doc). Close it with `await channel.close()`."""
    defaults = _CallDefaults(options.deadline_s, options.auth_token)
    interceptors = [
        _UnaryUnary(defaults),
        _UnaryStream(defaults),
        _StreamUnary(defaults),
        _StreamStream(defaults),
    ]
    opts = channel_options(options)
    if options.tls:
        return grpc.aio.secure_channel(
            address, _credentials(options), options=opts, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)


_STATUS_NAMES = {v: k for k, v in health_pb2.HealthCheckResponse.ServingStatus.items()}


async def wait_for_health(
    address: str,
    options: ClientOptions = ClientOptions(),
    timeout_s: float = 60.0,
    service: str = "",
) -> None:
    """Polls grpc.health.v1 Check on `address` until `service` is SERVING. Raises TimeoutError
    naming the address and the last status (or error) seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = "no answer yet"
    delay = 0.05
    # We poll ourselves: no channel-level retries, so each failure is seen (and reported) as is.
    async with open_channel(address, replace(options, retries=1)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                reply = await stub.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=max(0.05, min(remaining, 2.0))
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = _STATUS_NAMES.get(reply.status, str(reply.status))
            except grpc.aio.AioRpcError as error:
                last = f"{error.code().name}: {error.details()}"
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.5)
    label = f"service {service!r} at {address}" if service else address
    raise TimeoutError(f"{label} not SERVING after {timeout_s:g}s (last status: {last})")


class UnavailableBackoff:
    """The waits between tries at a service that is UNAVAILABLE (a process restarting, a pod
    being rescheduled), for `budget_s` in all: 0.2 s doubling to 5 s. `next_delay()` is None
    once the budget is spent. The channel's own retries (a few, within seconds) cover a
    blip; this covers a restart."""

    FIRST_S = 0.2
    MAX_S = 5.0

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self._deadline: float | None = None
        self._delay = self.FIRST_S
        self.tries = 0

    def next_delay(self) -> float | None:
        now = asyncio.get_running_loop().time()
        if self._deadline is None:
            self._deadline = now + self.budget_s
        remaining = self._deadline - now
        if remaining <= 0:
            return None
        delay, self._delay = min(self._delay, remaining), min(self._delay * 2, self.MAX_S)
        self.tries += 1
        return delay


async def call_while_unavailable(
    call: Callable[[], Awaitable[T]],
    budget_s: float,
    what: str,
    gone: Callable[[], Awaitable[bool]] | None = None,
) -> T:
    """`await call()`, tried again while it fails with UNAVAILABLE, for `budget_s` at most;
    then the last error is raised. `what` names the call in the log ("trainer GetStatus").
    `gone`, when given, decides whether an UNAVAILABLE means the server is down (wait for
    it) or is the server's own answer (raised at once)."""
    backoff = UnavailableBackoff(budget_s)
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or (gone is not None and not await gone()):
                raise
            delay = backoff.next_delay()
            if delay is None:
                raise
            if backoff.tries == 1:
                log.warning("%s: UNAVAILABLE (%s); retrying for up to %gs", what, error.details(), budget_s)
            await asyncio.sleep(delay)
