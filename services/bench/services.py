"""Services as the benchmarks and checks run them: `rlrun serve <service>` in a process of its
own with one torch thread, ready once its ready line names the address it listens on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from rlrun.common.service import serve_command

READY = re.compile(r"rlrun (?P<service>[\w-]+) listening on (?P<address>\S+)")


def free_port() -> int:
    """A port free on 127.0.0.1 now, for options that take no 0 (another process may still
    take it first)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start_service(
    service: str,
    config: Path,
    log_dir: Path,
    *args: str,
    overrides: Sequence[str] = (),
    ready_timeout_s: float = 180.0,
) -> tuple[asyncio.subprocess.Process, str]:
    """Starts the service on an OS-assigned port, its outputs and logs in `log_dir`; `overrides`
    are `--set` items, `args` further command-line options. Returns the process and its
    address; a service that prints no ready line in time is stopped and raises."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    sets = [arg for item in (*overrides, f'output_dir="{log_dir}"') for arg in ("--set", item)]
    process = await asyncio.create_subprocess_exec(
        *serve_command(service, config, log_dir, *sets, *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), ready_timeout_s)).decode().strip()
    except TimeoutError:
        line = f"no ready line within {ready_timeout_s:.0f} s"
    match = READY.fullmatch(line)
    if match is None:
        await stop_service(process)
        raise RuntimeError(f"rlrun serve {service} did not start (its logs are in {log_dir}): {line!r}")
    return process, match["address"]


async def stop_service(process: asyncio.subprocess.Process, timeout_s: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after `timeout_s`; returns the exit code."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it may have exited on its own
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
    return process.returncode


@contextlib.asynccontextmanager
async def served(
    service: str, config: Path, log_dir: Path, *args: str, overrides: Sequence[str] = ()
) -> AsyncIterator[str]:
    """`start_service` as a context: yields the address, stops the service on exit."""
    process, address = await start_service(service, config, log_dir, *args, overrides=overrides)
    try:
        yield address
    finally:
        await stop_service(process)
