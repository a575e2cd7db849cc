"""The process shell every `rlrun serve <service>` shares: logging, thread limits, the
metrics endpoint, the gRPC server with health and reflection, the ready line, and a
graceful SIGTERM. Services supply only `setup`, which registers their servicers."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rlrun.common.config import ConfigError, RunConfig
from rlrun.common.grpc_server import GrpcServer, ServerOptions, announce_ready
from rlrun.common.logs import setup_logging
from rlrun.common.memory import freeze_startup
from rlrun.common.metrics import start_metrics_server, stop_metrics_server
from rlrun.common.ports import CannotBind, cannot_bind

Cleanup = Callable[[], Awaitable[None]]
LAUNCHER_PID_ENV = "RLRUN_LAUNCHER_PID"
"""Set by `rlrun local` for its services: the pid whose death stops them."""
PR_SET_PDEATHSIG = 1


def stop_with_launcher() -> None:
    """Under `rlrun local`: SIGTERM this process when the launcher dies, even by SIGKILL (the
    kernel sends it). A launcher already gone before this ran is caught by its pid."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() != int(launcher):
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class ServiceContext:
    name: str
    config: RunConfig
    args: argparse.Namespace
    server: GrpcServer
    log: logging.Logger
    log_dir: Path
    serving_on_start: bool = True
    """Set False in setup to keep health NOT_SERVING until the service calls server.set_serving(True)."""
    background: list[asyncio.Task] = field(default_factory=list)
    """Tasks cancelled on shutdown."""
    exit_code: int = 0
    """What the process exits with; a service that stops on a fatal error sets it non-zero."""

    def fail(self, reason: str) -> None:
        """Stops the service on a fatal error: health NOT_SERVING, drain, exit code 1."""
        self.log.error("stopping: %s", reason)
        self.exit_code = 1
        self.background.append(asyncio.ensure_future(self.server.stop()))


def limit_threads(num_threads: int) -> None:
    """One thread per service on small machines: oversubscription costs 10-50x.

    The environment variables cover every library that reads them at import (torch among
    them); a torch that is already imported is set directly. Torch is never imported here,
    so the orchestrator and env-server processes stay torch-free."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(num_threads)
    torch = sys.modules.get("torch")
    if torch is None:
        return
    torch.set_num_threads(num_threads)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set once in this process
            pass


def stdout_for_ready_line() -> TextIO:
    """Keeps stdout for the ready line alone and returns a stream to print it on. Launchers
    parse that line, and one that stops reading after it would leave a process that writes
    more blocked on a full pipe. Whatever else reaches file descriptor 1 (print, a library's
    log handler such as vLLM's, a C extension, a child process) goes to stderr instead."""
    sys.stdout.flush()
    ready = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return ready


def serve_command(service: str, config: Path, log_dir: Path, *args: str) -> list[str]:
    """The command line of `rlrun serve <service>` with this interpreter, on an OS-assigned
    port of 127.0.0.1, its log in `log_dir`; `args` are further options (`--set` items too)."""
    return [
        sys.executable,
        "-m",
        "rlrun.cli",
        "serve",
        service,
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--log-dir",
        str(log_dir),
        *args,
    ]


def log_dir_for(config: RunConfig, args: argparse.Namespace) -> Path:
    return Path(args.log_dir) if getattr(args, "log_dir", None) else config.run_dir / "logs"


def _start_metrics(args: argparse.Namespace) -> int:
    try:
        return start_metrics_server(args.metrics_port, args.host)
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise cannot_bind(
            "the metrics endpoint", args.host, args.metrics_port, "--metrics-port", reason
        ) from None


async def _serve(
    name: str,
    config: RunConfig,
    args: argparse.Namespace,
    service_names: list[str],
    setup: Callable[[ServiceContext], Awaitable[Cleanup | None]],
    ready_stream: TextIO,
) -> int:
    log_dir = log_dir_for(config, args)
    log = setup_logging(name, log_dir / f"{name}.log", config.log_level)
    server = GrpcServer(ServerOptions.from_config(config.grpc, args.host, args.port), service_names)
    # Every port first: a taken one ends the service at once, before anything is loaded or
    # started (a replica whose port was taken once loaded its model and then hung).
    server.bind("--port")
    ctx = ServiceContext(name=name, config=config, args=args, server=server, log=log, log_dir=log_dir)
    metrics_port = None
    cleanup = None
    try:
        if getattr(args, "metrics_port", None) is not None:
            metrics_port = _start_metrics(args)
            log.info("metrics on http://%s:%d/metrics", args.host, metrics_port)
        cleanup = await setup(ctx)
        freeze_startup()
        port = await server.start()
        if ctx.serving_on_start:
            server.set_serving(True)
        server.install_signal_handlers()
        announce_ready(name, args.host, port, ready_stream)
        log.info("%s listening on %s:%d", name, args.host, port)
        await server.wait_for_termination()
    finally:
        for task in ctx.background:
            task.cancel()
        await asyncio.gather(*ctx.background, return_exceptions=True)
        if cleanup is not None:
            await cleanup()
        await server.stop(0)  # a no-op after a normal shutdown; frees the port after a failed start
        if metrics_port is not None:
            stop_metrics_server(metrics_port)
        log.info("%s stopped", name)
    return ctx.exit_code


def serve_main(
    name: str,
    config: RunConfig,
    args: argparse.Namespace,
    service_names: list[str],
    setup: Callable[[ServiceContext], Awaitable[Cleanup | None]],
    num_threads: int = 1,
) -> int:
    """Runs a service until SIGTERM; returns the process exit code (1 at once, with one line
    on stderr that says what to do, when a port is taken or the setup finds the config
    unusable)."""
    limit_threads(num_threads)
    try:
        with stdout_for_ready_line() as ready_stream:
            return asyncio.run(_serve(name, config, args, service_names, setup, ready_stream))
    except (CannotBind, ConfigError) as error:
        print(f"rlrun serve {name}: {error}", file=sys.stderr, flush=True)
        return 1
