"""gRPC server scaffolding shared by every rlrun service (grpc.aio).

    srv = GrpcServer(ServerOptions.from_config(cfg.grpc, host, port),
                     [inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name])
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, srv.server)
    port = await srv.start()            # health: NOT_SERVING until set_serving(True)
    srv.install_signal_handlers()
    srv.set_serving(True)
    announce_ready("inference", host, port)
    await srv.wait_for_termination()

Every server serves the standard health service (grpc.health.v1.Health) and server reflection.
With `auth_token` set, every call except health and reflection must carry the metadata
`authorization: Bearer <token>`, or it gets UNAUTHENTICATED.

Shutdown (`stop`, or SIGTERM/SIGINT after `install_signal_handlers`):
1. health goes NOT_SERVING for "" and every service;
2. drain: the server keeps accepting calls (so health probes see NOT_SERVING and load balancers
   take the endpoint out) until the calls in flight have finished, at most `grace` seconds;
3. open health Watch streams are ended, and `server.stop(remaining grace)` stops the server,
   cancelling whatever is still running when the grace is spent.
A second signal skips what is left of the grace.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import signal
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rlrun.common.ports import cannot_bind, why_unbindable

if TYPE_CHECKING:
    from rlrun.common.config.grpc import GrpcConfig

__all__ = [
    "AUTH_METADATA_KEY",
    "HEALTH_SERVICE_NAME",
    "GrpcServer",
    "HealthServicer",
    "ServerOptions",
    "announce_ready",
    "format_address",
    "read_token_file",
]

log = logging.getLogger("rlrun.common.grpc")

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
AUTH_METADATA_KEY = "authorization"
# Methods that need no token and do not count as work in flight.
_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def read_token_file(path: Path | str | None) -> str | None:
    """The bearer token stored in `path` (surrounding whitespace stripped), or None."""
    if path is None:
        return None
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"auth token file {path} is empty")
    return token


def format_address(host: str, port: int) -> str:
    """`host:port`, bracketing IPv6 literals."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def announce_ready(service: str, host: str, port: int, stream: TextIO | None = None) -> None:
    """Prints exactly `rlrun <service> listening on HOST:PORT` to `stream` (default stdout)
    and flushes."""
    stream = stream or sys.stdout
    stream.write(f"rlrun {service} listening on {format_address(host, port)}\n")
    stream.flush()


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = OS-assigned
    max_message_bytes: int = 64 * 2**20
    shutdown_grace_s: float = 5.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    require_client_cert: bool = False  # mTLS
    auth_token: str | None = None  # required on every call except health and reflection

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be set together")
        if self.require_client_cert and (self.tls_ca is None or self.tls_cert is None):
            raise ValueError("require_client_cert needs tls_cert, tls_key and tls_ca")
        if self.max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be positive")
        if self.shutdown_grace_s < 0:
            raise ValueError("shutdown_grace_s must be >= 0")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ValueError("auth_token must not be blank")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @classmethod
    def from_config(cls, grpc_cfg: GrpcConfig, host: str, port: int) -> ServerOptions:
        tls = grpc_cfg.tls
        return cls(
            host=host,
            port=port,
            max_message_bytes=grpc_cfg.max_message_mb * 2**20,
            shutdown_grace_s=grpc_cfg.shutdown_grace_s,
            tls_cert=tls.cert,
            tls_key=tls.key,
            tls_ca=tls.ca,
            require_client_cert=tls.require_client_cert,
            auth_token=read_token_file(grpc_cfg.auth_token_file),
        )


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health with a synchronous, thread-safe `set`.

    Unknown services get NOT_FOUND from Check and SERVICE_UNKNOWN from Watch (as the spec says).
    `close_watches()` ends every open Watch stream after it has sent the current status.
    """

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._watchers: dict[str, set[asyncio.Queue]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def get(self, service: str = "") -> int | None:
        return self._status.get(service)

    def set(self, service: str, status: int) -> None:
        with self._lock:
            self._status[service] = status
            queues = list(self._watchers.get(service, ()))
        for queue in queues:
            self._post(queue, status)

    def close_watches(self) -> None:
        with self._lock:
            queues = [q for qs in self._watchers.values() for q in qs]
        for queue in queues:
            self._post(queue, None)

    def _post(self, queue: asyncio.Queue, item: int | None) -> None:
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            queue.put_nowait(item)
        else:
            loop.call_soon_threadsafe(queue.put_nowait, item)

    async def Check(self, request, context):
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._watchers.setdefault(request.service, set()).add(queue)
        try:
            last = self._status.get(request.service, _UNKNOWN)
            yield health_pb2.HealthCheckResponse(status=last)
            while True:
                status = await queue.get()
                if status is None:
                    return
                if status != last:
                    last = status
                    yield health_pb2.HealthCheckResponse(status=status)
        finally:
            with self._lock:
                watchers = self._watchers.get(request.service)
                if watchers is not None:
                    watchers.discard(queue)
                    if not watchers:
                        del self._watchers[request.service]


class _InFlight:
    """Counts calls in flight (health and reflection excluded) for the shutdown drain."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if self.count == 0:
                self._idle.set()
        return self._idle

    def enter(self) -> None:
        self.count += 1
        self._event().clear()

    def exit(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._event().set()

    async def wait_idle(self, timeout: float, force: asyncio.Event) -> bool:
        """True once nothing is in flight; False when `timeout` passed or `force` was set."""
        idle = asyncio.ensure_future(self._event().wait())
        forced = asyncio.ensure_future(force.wait())
        try:
            await asyncio.wait({idle, forced}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
            forced.cancel()
        return self.count == 0


def _exempt(method: str) -> bool:
    return method.startswith(_EXEMPT_PREFIXES)


def _handler_behavior(handler: grpc.RpcMethodHandler):
    if handler.request_streaming and handler.response_streaming:
        return "stream_stream", handler.stream_stream
    if handler.request_streaming:
        return "stream_unary", handler.stream_unary
    if handler.response_streaming:
        return "unary_stream", handler.unary_stream
    return "unary_unary", handler.unary_unary


_HANDLER_FACTORIES = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _rebuild(handler: grpc.RpcMethodHandler, kind: str, behavior) -> grpc.RpcMethodHandler:
    return _HANDLER_FACTORIES[kind](
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _metadata_value(metadata, key: str) -> str | None:
    for item in metadata or ():
        k, v = item[0], item[1]
        if k.lower() == key:
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return None


_MAX_TRACKED_HANDLERS = 1024


class _ServerInterceptor(grpc.aio.ServerInterceptor):
    """Bearer-token check plus in-flight accounting."""

    def __init__(self, auth_token: str | None, in_flight: _InFlight) -> None:
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None
        self._in_flight = in_flight
        # The tracked handler of each method handler, built once: the handlers the server
        # resolves are the same objects call after call.
        self._tracked: dict[int, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def _authorized(self, metadata) -> str | None:
        """None when the call may proceed, else the reason it may not."""
        if self._expected is None:
            return None
        value = _metadata_value(metadata, AUTH_METADATA_KEY)
        if value is None:
            return "missing bearer token (metadata 'authorization: Bearer <token>')"
        if not hmac.compare_digest(value.encode(), self._expected):
            return "invalid bearer token"
        return None

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if _exempt(method):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        denied = self._authorized(handler_call_details.invocation_metadata)
        if denied is not None:

            async def deny(request, context):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, denied)

            kind, _ = _handler_behavior(handler)
            return _rebuild(handler, kind, deny)
        cached = self._tracked.get(id(handler))
        if cached is not None and cached[0] is handler:
            return cached[1]
        kind, behavior = _handler_behavior(handler)
        tracked = _rebuild(handler, kind, self._track(behavior))
        if len(self._tracked) < _MAX_TRACKED_HANDLERS:  # bounded, should a handler be built per call
            self._tracked[id(handler)] = (handler, tracked)
        return tracked

    def _track(self, behavior):
        in_flight = self._in_flight
        if inspect.isasyncgenfunction(behavior):

            async def tracked_stream(request, context):
                in_flight.enter()
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    in_flight.exit()

            return tracked_stream
        if inspect.iscoroutinefunction(behavior):

            async def tracked(request, context):
                in_flight.enter()
                try:
                    return await behavior(request, context)
                finally:
                    in_flight.exit()

            return tracked
        return behavior  # synchronous handlers run in an executor; not tracked


class GrpcServer:
    """A grpc.aio server with the standard health service (grpc.health.v1) and server reflection."""

    def __init__(self, options: ServerOptions, service_names: Iterable[str]):
        self.options = options
        self.service_names: list[str] = list(service_names)
        self.port: int = 0
        self.address: str = ""
        self._in_flight = _InFlight()
        self._stopping = False
        self._stop_task: asyncio.Future | None = None
        self._force: asyncio.Event | None = None
        self._signals_installed: list[int] = []
        self._install_signals_on_start = False
        self._started = False

        self.server: grpc.aio.Server = grpc.aio.server(
            interceptors=[_ServerInterceptor(options.auth_token, self._in_flight)],
            options=[
                ("grpc.max_send_message_length", options.max_message_bytes),
                ("grpc.max_receive_message_length", options.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        self.health = HealthServicer()
        for name in ["", *self.service_names]:
            self.health.set(name, _NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.service_names, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def _credentials(self) -> grpc.ServerCredentials:
        o = self.options
        assert o.tls_cert is not None and o.tls_key is not None
        ca = Path(o.tls_ca).read_bytes() if (o.require_client_cert and o.tls_ca) else None
        return grpc.ssl_server_credentials(
            [(Path(o.tls_key).read_bytes(), Path(o.tls_cert).read_bytes())],
            root_certificates=ca,
            require_client_auth=o.require_client_cert,
        )

    def bind(self, source: str = "its port") -> int:
        """Binds the port (TLS if configured) and returns it; the server accepts calls only
        once started. `source` names what sets the port, for the CannotBind a taken one
        raises (a service binds before it starts anything, so that it fails at once)."""
        if self.port:
            return self.port
        host, wanted = self.options.host, self.options.port
        # Asked first, so that a taken port is said once, here (gRPC would log its own line).
        taken = why_unbindable(host, wanted) if wanted else None
        if taken is not None:
            raise cannot_bind("the gRPC server", host, wanted, source, taken)
        bind = format_address(host, wanted)
        try:
            if self.options.tls:
                port = self.server.add_secure_port(bind, self._credentials())
            else:
                port = self.server.add_insecure_port(bind)
        except RuntimeError:
            port = 0
        if not port:
            raise cannot_bind("the gRPC server", host, wanted, source)
        self.port = port
        self.address = format_address(self.options.host, port)
        return port

    async def start(self) -> int:
        """Binds (unless `bind` did), starts, and returns the bound port. Health stays
        NOT_SERVING until `set_serving(True)`."""
        loop = asyncio.get_running_loop()
        self.health.bind_loop(loop)
        port = self.bind()
        await self.server.start()
        self._started = True
        log.info(
            "gRPC server on %s (tls=%s, mtls=%s, auth=%s) services=%s",
            self.address,
            self.options.tls,
            self.options.require_client_cert,
            self.options.auth_token is not None,
            self.service_names,
        )
        if self._install_signals_on_start:
            self.install_signal_handlers()
        return port

    def set_serving(self, serving: bool, service: str | None = None) -> None:
        """Sets health to SERVING or NOT_SERVING for `service`, or (None) for the overall
        status "" and every registered service. Ignored once shutdown has begun."""
        if self._stopping:
            return
        status = _SERVING if serving else _NOT_SERVING
        names = ["", *self.service_names] if service is None else [service]
        for name in names:
            self.health.set(name, status)

    @property
    def serving(self) -> bool:
        return self.health.get("") == _SERVING

    async def stop(self, grace: float | None = None) -> None:
        """Health -> NOT_SERVING, drain calls in flight for up to `grace` seconds (default
        `options.shutdown_grace_s`), then stop the server. Safe to call more than once."""
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stop_task)

    async def _stop(self, grace: float | None) -> None:
        grace = self.options.shutdown_grace_s if grace is None else max(0.0, float(grace))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for name in ["", *self.service_names]:
            self.health.set(name, _NOT_SERVING)
        self._stopping = True
        if self._force is None:
            self._force = asyncio.Event()
        if self._started and grace > 0:
            log.info("draining %d call(s) in flight, grace %.1fs", self._in_flight.count, grace)
            await self._in_flight.wait_idle(grace, self._force)
        self.health.close_watches()
        remaining = 0.0 if self._force.is_set() else max(0.0, deadline - loop.time())
        await self.server.stop(remaining)
        self._remove_signal_handlers()
        log.info("gRPC server on %s stopped", self.address or "(unbound)")

    # -- signals -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: health NOT_SERVING, then stop(grace). A second signal stops at once.
        Called outside a running event loop, the handlers are installed by `start()`."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._install_signals_on_start = True
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / Windows
                log.warning("cannot install a handler for %s", signal.Signals(sig).name)
                continue
            self._signals_installed.append(sig)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stop_task is None:
            log.info("%s: shutting down (grace %.1fs)", name, self.options.shutdown_grace_s)
            self._stop_task = asyncio.ensure_future(self._stop(None))
            return
        log.warning("%s again: stopping now", name)
        if self._force is None:
            self._force = asyncio.Event()
        self._force.set()
        asyncio.ensure_future(self.server.stop(0))

    def _remove_signal_handlers(self) -> None:
        if not self._signals_installed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for sig in self._signals_installed:
            loop.remove_signal_handler(sig)
        self._signals_installed.clear()

    async def wait_for_termination(self) -> None:
        """Returns once the server has stopped (and the shutdown sequence has finished)."""
        await self.server.wait_for_termination()
        if self._stop_task is not None:
            await asyncio.shield(self._stop_task)
