"""Keeps every inference replica on the trainer's policy version between steps.

A replica that restarts comes back with its initial weights (version 0) and stays NOT_SERVING
until it holds the live version; one that missed a broadcast holds an older one. Waiting for
the next step would leave it idle (or generating stale rollouts) for a whole step, and a run
stopped for any reason would never fix it. So the trainer asks every replica for its version
every `trainer.broadcast.resync_interval_s` and pushes the current weights to those behind.

The replica list itself may change while the trainer runs (inference scaled in the cluster:
the operator rewrites `inference.addresses` in the mounted config file, which the kubelet
updates in place, and leaves the trainer's pod alone). `addresses()` is read every round; a
new replica is synced at once, and a removed one is no longer broadcast to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

import grpc

from rlrun.common.grpc_client import ClientOptions
from rlrun.common.weights.protocol import resize_channels
from rlrun.common.wire.inference import status_from_proto, status_request
from rlrun.trainer.runtime import TrainerRuntime
from rlrun.v1 import inference_pb2_grpc

log = logging.getLogger("rlrun.trainer.replica_watch")


class ReplicaWatch:
    def __init__(
        self,
        runtime: TrainerRuntime,
        client: ClientOptions,
        interval_s: float,
        addresses: Callable[[], list[str]] | None = None,
    ):
        self.runtime = runtime
        self.interval_s = interval_s
        self.addresses = addresses
        # One attempt per probe: a replica that is down is simply asked again next round.
        self.options = dataclasses.replace(client, retries=1, deadline_s=max(1.0, interval_s))
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.stubs: dict[str, inference_pb2_grpc.InferenceServiceStub] = {}

    async def follow_addresses(self) -> None:
        """Probes exactly the configured replicas (re-read when `addresses` is given)."""
        wanted = list(self.runtime.broadcaster.addresses)
        if self.addresses is not None:
            try:
                wanted = list(self.addresses())
            except (OSError, ValueError) as error:  # a file being replaced; the next round reads it
                log.warning("could not re-read inference.addresses: %s", error)
            if wanted != self.runtime.broadcaster.addresses:
                log.info("inference replicas now: %s", ", ".join(wanted) or "none")
                await self.runtime.set_replicas(wanted)
        if wanted != list(self.channels):
            await resize_channels(self.channels, wanted, self.options)
            self.stubs = {a: inference_pb2_grpc.InferenceServiceStub(c) for a, c in self.channels.items()}

    async def _version(self, address: str) -> int | None:
        """The replica's policy version, or None when it does not answer."""
        try:
            return status_from_proto(await self.stubs[address].GetStatus(status_request())).policy_version
        except grpc.aio.AioRpcError:
            return None

    async def lagging(self) -> list[str]:
        """Replicas that answer but hold another version than the trainer's: older (restarted,
        or left out of a broadcast) or newer (steps a restarted trainer lost). A step that
        ends between the two looks makes a replica look ahead; it is then pushed the same
        weights again, which is harmless."""
        live = self.runtime.version
        versions = await asyncio.gather(*(self._version(a) for a in self.stubs))
        return [
            address
            for address, version in zip(self.stubs, versions, strict=True)
            if version is not None and (version != live or address in self.runtime.left_out)
        ]

    async def run(self) -> None:
        while True:
            await self.follow_addresses()
            lagging = await self.lagging()
            if lagging and not self.runtime.lock.locked():  # a step's broadcast is on its way anyway
                log.info("replicas behind version %d: %s", self.runtime.version, ", ".join(lagging))
                await self.runtime.resync(lagging)
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels.values()))
