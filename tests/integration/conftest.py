"""Fixtures every integration test may use: `spawn_service`, a real `rlrun serve ...` process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from dataclasses import dataclass
from typing import BinaryIO

import grpc
import pytest

from rlrun.common.grpc_client import ClientOptions, open_channel

READY = re.compile(r"^rlrun (\S+) listening on (\S+)$")


@dataclass
class ServiceProcess:
    process: asyncio.subprocess.Process
    address: str
    channel: grpc.aio.Channel
    stderr: BinaryIO

    async def stop(self) -> int:
        """SIGTERM, then SIGKILL if it has not exited within 30 s; returns the exit code."""
        await self.channel.close()
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.stderr.close()
        return self.process.returncode


@pytest.fixture
async def spawn_service(tmp_path):
    """spawn_service(argv) -> a service subprocess (`rlrun serve ...`, or torchrun running it)
    that has printed its ready line; stopped with SIGTERM at the end of the test. Its stderr
    goes to tmp_path/service-<n>.stderr."""
    spawned: list[ServiceProcess] = []

    async def spawn(argv: list[str]) -> ServiceProcess:
        stderr = open(tmp_path / f"service-{len(spawned)}.stderr", "wb")  # noqa: SIM115 - closed by stop()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env
        )
        address = None
        try:
            async with asyncio.timeout(180):
                while address is None:
                    line = await process.stdout.readline()
                    if not line:
                        raise RuntimeError(f"exited before its ready line: {argv}")
                    match = READY.match(line.decode().strip())
                    address = match.group(2) if match else None
        except BaseException:
            process.kill()
            await process.wait()
            stderr.close()
            raise
        service = ServiceProcess(
            process, address, open_channel(address, ClientOptions(deadline_s=120)), stderr
        )
        spawned.append(service)
        return service

    yield spawn
    for service in spawned:
        await service.stop()
