"""Weight broadcast to inference replicas over gRPC: one UpdateWeights client stream per
replica (a header, then chunks of at most 4 MiB), all replicas concurrently.

The messages are built once per update (in a thread: it is CPU work) and the same list is
streamed to every replica. A replica answering UNAVAILABLE is retried with backoff; one that
stays down, or fails otherwise, is reported in its `ReplicaResult` and never holds up the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.model.weights import iter_update_messages
from rlrun.v1 import inference_pb2_grpc, trainer_pb2

log = logging.getLogger("rlrun.trainer.broadcast")

BACKOFF_S = 0.2
MAX_BACKOFF_S = 2.0


@dataclass
class ReplicaResult:
    address: str
    ok: bool
    error: str = ""
    seconds: float = 0.0
    bytes: int = 0

    def to_proto(self) -> trainer_pb2.BroadcastResult:
        return trainer_pb2.BroadcastResult(
            address=self.address, ok=self.ok, error=self.error, seconds=self.seconds, bytes=self.bytes
        )


class WeightBroadcaster(Protocol):
    @property
    def tensors_on_cpu(self) -> bool:
        """Whether `broadcast` wants CPU tensors (gRPC) or tensors left on the GPU (NCCL)."""
        ...

    @property
    def addresses(self) -> list[str]:
        """Every replica it can reach, in configured order."""
        ...

    async def set_addresses(self, addresses: list[str]) -> None:
        """The replica set changed (inference scaled): opens and closes channels to match."""
        ...

    async def broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        to: Sequence[str] | None = None,
        rollback: bool = False,
    ) -> list[ReplicaResult]:
        """To the replicas `to` (default: all), one result each. `rollback`: the version may
        be older than the replicas' (the trainer went back to a checkpoint)."""
        ...

    async def close(self) -> None: ...


def replica_client_options(base: ClientOptions, config: BroadcastConfig) -> ClientOptions:
    """No channel-level retries: a client stream is retried here, whole, from its header."""
    return dataclasses.replace(base, retries=1, deadline_s=config.timeout_s)


async def retry_unavailable(address: str, attempt_call, retries: int) -> tuple[object | None, str]:
    """Runs `attempt_call()` until it succeeds, fails with a code other than UNAVAILABLE, or
    has been retried `retries` times. Returns (response, "") or (None, error)."""
    attempt = 0
    while True:
        try:
            return await attempt_call(), ""
        except grpc.aio.AioRpcError as error:
            message = f"{error.code().name}: {error.details()}"
            if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == retries:
                return None, message
            delay = min(MAX_BACKOFF_S, BACKOFF_S * 2**attempt)
            attempt += 1
            log.warning(
                "replica %s unavailable (attempt %d of %d), retrying in %.1fs: %s",
                address,
                attempt,
                retries + 1,
                delay,
                message,
            )
            await asyncio.sleep(delay)


async def resize_channels(
    channels: dict[str, grpc.aio.Channel], addresses: list[str], options: ClientOptions
) -> None:
    """`channels` (address -> channel) made to hold exactly `addresses`, in their order."""
    gone = [channels.pop(a) for a in list(channels) if a not in addresses]
    await asyncio.gather(*(channel.close() for channel in gone))
    kept = dict(channels)
    channels.clear()
    channels.update({a: kept.get(a) or open_channel(a, options) for a in addresses})


class ReplicaChannels:
    """What every broadcaster keeps: one gRPC channel per replica, in configured order, with
    the options a weight update's stream runs under."""

    def __init__(self, addresses: list[str], config: BroadcastConfig, client: ClientOptions):
        self.config = config
        self.options = replica_client_options(client, config)
        self.channels: dict[str, grpc.aio.Channel] = {a: open_channel(a, self.options) for a in addresses}

    @property
    def addresses(self) -> list[str]:
        return list(self.channels)

    def targets(self, to: Sequence[str] | None) -> list[str]:
        """The replicas of one broadcast: `to`, or all of them."""
        return list(self.channels) if to is None else list(to)

    async def set_addresses(self, addresses: list[str]) -> None:
        await resize_channels(self.channels, addresses, self.options)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels.values()))


class GrpcWeightBroadcaster(ReplicaChannels):
    tensors_on_cpu = True

    async def _send(
        self, address: str, tensors: dict[str, torch.Tensor], version: int, total_bytes: int, rollback: bool
    ) -> ReplicaResult:
        stub = inference_pb2_grpc.InferenceServiceStub(self.channels[address])
        started = time.perf_counter()
        chunk_bytes = int(self.config.chunk_mb * 2**20)

        async def attempt():
            # Chunks are cut while the stream goes out, as a raw client would, not built up front.
            messages = iter_update_messages(tensors, version, chunk_bytes, rollback)
            return await stub.UpdateWeights(messages, timeout=self.config.timeout_s)

        response, error = await retry_unavailable(address, attempt, self.config.retries)
        seconds = time.perf_counter() - started
        if response is None:
            log.error("weight update to %s failed: %s", address, error)
            return ReplicaResult(address=address, ok=False, error=error, seconds=seconds)
        return ReplicaResult(address=address, ok=True, seconds=seconds, bytes=total_bytes)

    async def broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        to: Sequence[str] | None = None,
        rollback: bool = False,
    ) -> list[ReplicaResult]:
        targets = self.targets(to)
        if not targets:
            return []
        total_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return list(
            await asyncio.gather(*(self._send(a, tensors, version, total_bytes, rollback) for a in targets))
        )
