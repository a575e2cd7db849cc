"""The inference service assembled: engine, gRPC servicer, optional OpenAI-compatible HTTP
app, and readiness. Health is SERVING, and Generate admitted, once the model is loaded and the
replica holds the live policy version: `--require-version N` names it, and otherwise, when
`trainer.address` is known, the replica asks the trainer (a restarted replica comes back with
its initial weights, and the trainer's replica watch pushes it the live ones)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import grpc

from rlrun.common.config import RunConfig
from rlrun.common.grpc_client import ClientOptions, UnavailableBackoff, open_channel
from rlrun.common.grpc_server import GrpcServer
from rlrun.common.ports import listen_socket
from rlrun.common.service import ServiceContext
from rlrun.common.tokenizer_info import load_with_info
from rlrun.common.wire.trainer import status_from_proto, status_request
from rlrun.inference.engines import create_engine
from rlrun.inference.engines.base import Engine
from rlrun.inference.http_server import HttpServer, http_security
from rlrun.inference.openai.app import build_openai_app
from rlrun.inference.servicer import InferenceServicer
from rlrun.inference.text_path import TextPath
from rlrun.v1 import inference_pb2_grpc, trainer_pb2_grpc

log = logging.getLogger(__name__)


class InferenceService:
    def __init__(
        self,
        config: RunConfig,
        grpc_server: GrpcServer,
        *,
        host: str = "127.0.0.1",
        http_port: int | None = None,
        http_port_source: str = "inference.http_port",
        require_version: int | None = None,
        engine: Engine | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ):
        self.config = config
        self.grpc_server = grpc_server
        self.host = host
        self.http_port = http_port
        self.http_port_source = http_port_source
        """What set `http_port` (an option or config key), named when the port is taken."""
        self.require_version = require_version
        self.engine = engine
        self.on_fatal = on_fatal
        self.http: HttpServer | None = None
        self.asks_trainer = require_version is None and bool(config.trainer.address)

    def not_ready(self) -> str | None:
        if self.asks_trainer:
            return "this replica is waiting for the trainer to tell it the live policy version"
        if self.require_version is not None and self.engine.policy_version < self.require_version:
            return (
                f"this replica holds policy version {self.engine.policy_version} and waits for "
                f"version {self.require_version} from the trainer"
            )
        return None

    def ready(self) -> bool:
        return self.not_ready() is None

    async def learn_live_version(self) -> None:
        """Asks the trainer for its policy version until it answers (it may be restarting
        too), then requires it."""
        options = ClientOptions.from_config(self.config.grpc)
        async with open_channel(self.config.trainer.address, options) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            backoff = UnavailableBackoff(float("inf"))
            while True:
                try:
                    trainer = status_from_proto(await stub.GetStatus(status_request(), timeout=10.0))
                    break
                except grpc.aio.AioRpcError as error:
                    log.info(
                        "trainer %s not answering yet: %s", self.config.trainer.address, error.code().name
                    )
                    await asyncio.sleep(backoff.next_delay() or UnavailableBackoff.MAX_S)
        self.require_version, self.asks_trainer = trainer.policy_version, False
        log.info(
            "the live policy version is %d; this replica holds %d",
            trainer.policy_version,
            self.engine.policy_version,
        )
        self.grpc_server.set_serving(self.ready())

    def _on_weights_applied(self, version: int) -> None:
        self.grpc_server.set_serving(self.ready())

    def _engine_died(self, error: Exception) -> None:
        self.grpc_server.set_serving(False)
        if self.on_fatal is not None:
            self.on_fatal(f"the engine died: {error}")

    async def start(self) -> None:
        """Binds the HTTP port (first: a taken one fails before the model loads), loads the
        model and registers the servicer; call before the gRPC server starts."""
        listener = None
        if self.http_port is not None:
            listener = listen_socket(
                self.host, self.http_port, "the OpenAI-compatible HTTP API", self.http_port_source
            )
        try:
            await self._load(listener)
        except BaseException:
            if listener is not None and self.http is None:
                listener.close()
            raise

    async def _load(self, listener: socket.socket | None) -> None:
        if self.engine is None:
            self.engine = create_engine(self.config)
        self.engine.on_dead = self._engine_died
        await self.engine.start()
        tokenizer, info = load_with_info(self.config.model.tokenizer, self.config.model.path)
        text = TextPath(tokenizer, info)
        limits = self.config.request_limits()
        servicer = InferenceServicer(self.engine, text, limits, self._on_weights_applied, self.not_ready)
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, self.grpc_server.server)
        if listener is not None:
            app = build_openai_app(
                self.engine,
                tokenizer,
                self.config.name,
                self.ready,
                limits,
                text,
                self.config.inference.tool_call_parser,
            )
            self.http = HttpServer(app, listener, **http_security(self.config))
            await self.http.start()
            log.info("OpenAI-compatible HTTP on %s/v1", self.http.url)
        if not self.ready():
            log.info("health stays NOT_SERVING until then: %s", self.not_ready())
        self.grpc_server.set_serving(self.ready())

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.stop()
        if self.engine is not None:
            await self.engine.stop()


async def setup(ctx: ServiceContext):
    """`serve_main`'s hook for `rlrun serve inference`."""
    ctx.serving_on_start = False
    flag = ctx.args.http_port is not None
    service = InferenceService(
        ctx.config,
        ctx.server,
        host=ctx.args.host,
        http_port=ctx.args.http_port if flag else ctx.config.inference.http_port,
        http_port_source="--http-port" if flag else "inference.http_port",
        require_version=ctx.args.require_version,
        on_fatal=ctx.fail,
    )
    await service.start()
    if service.asks_trainer:
        ctx.background.append(asyncio.create_task(service.learn_live_version()))
    return service.stop
