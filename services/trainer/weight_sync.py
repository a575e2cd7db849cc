"""Which weight transport reaches which replica, and the broadcaster `trainer.broadcast.transport`
builds (`make_broadcaster`).

- "grpc": the chunk stream (`broadcast.GrpcWeightBroadcaster`); works everywhere, the CPU path.
- "ipc": the trainer's staging buffer mapped by replicas on its node
  (`ipc_broadcast.IpcWeightBroadcaster`): CUDA IPC on a GPU, shared memory on CPU.
- "nccl": a collective (`collective_broadcast.CollectiveWeightBroadcaster`): vLLM's
  PyNcclCommunicator for `inference.engine = "vllm"`; for the torch engine a standalone
  torch.distributed group, NCCL when the trainer is on CUDA, else gloo.
- "auto": gRPC when the trainer is on CPU. On CUDA, per replica, from what it reports in
  GetStatus (`WeightSyncInfo`, `choose_transport`): IPC when it is a CUDA replica on the
  trainer's node; a torch NCCL group when it is a CUDA replica elsewhere; vLLM's
  PyNcclCommunicator when it joins only that; gRPC otherwise. A replica that fails an update
  over IPC or a collective gets it over gRPC at once, and stays there.

`measure_sync` times a sync to one served replica (the GPU benchmark's weight-sync figure).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence

import grpc
import torch

from rlrun.common.config import RunConfig
from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.inference.weight_transports import node_id
from rlrun.trainer.broadcast import (
    GrpcWeightBroadcaster,
    ReplicaResult,
    WeightBroadcaster,
    replica_client_options,
    resize_channels,
)
from rlrun.trainer.collective_broadcast import CollectiveWeightBroadcaster
from rlrun.trainer.ipc_broadcast import IpcWeightBroadcaster
from rlrun.v1 import inference_pb2, inference_pb2_grpc, weights_pb2

log = logging.getLogger("rlrun.trainer.weight_sync")

PROBE_TIMEOUT_S = 10.0


def choose_transport(
    trainer_device: torch.device, trainer_node: str, replica: weights_pb2.WeightSyncInfo
) -> str:
    """ "grpc", "ipc", "nccl" (torch.distributed) or "pynccl" (vLLM's communicator) for one
    replica, as "auto" picks it."""
    if trainer_device.type != "cuda":
        return "grpc"
    on_cuda = replica.device.startswith("cuda")
    if on_cuda and weights_pb2.WEIGHT_TRANSPORT_IPC in replica.transports and replica.node_id == trainer_node:
        return "ipc"
    if weights_pb2.WEIGHT_TRANSPORT_NCCL in replica.transports:
        if on_cuda and weights_pb2.COLLECTIVE_BACKEND_TORCH_NCCL in replica.backends:
            return "nccl"
        if weights_pb2.COLLECTIVE_BACKEND_PYNCCL in replica.backends:
            return "pynccl"
    return "grpc"


class AutoWeightBroadcaster:
    """Sends each replica the update over the transport `choose_transport` picks for it, all
    transports at once. A replica that fails an IPC or collective update gets it over gRPC at
    once, and stays on gRPC if that works. A replica's choice is kept until it fails an
    update (it may have come back elsewhere, or as another engine)."""

    tensors_on_cpu = False

    def __init__(
        self,
        addresses: list[str],
        by_transport: dict[str, WeightBroadcaster],
        client: ClientOptions,
        config: BroadcastConfig,
        device: torch.device,
    ):
        self.by_transport = by_transport
        self.device = device
        self.node = node_id()
        self.options = replica_client_options(client, config)
        self.channels = {address: open_channel(address, self.options) for address in addresses}
        self.choices: dict[str, str] = {}

    @property
    def addresses(self) -> list[str]:
        return list(self.channels)

    async def set_addresses(self, addresses: list[str]) -> None:
        await resize_channels(self.channels, addresses, self.options)
        await asyncio.gather(*(b.set_addresses(addresses) for b in self.by_transport.values()))
        self.choices = {a: t for a, t in self.choices.items() if a in addresses}

    async def _choose(self, address: str) -> str:
        stub = inference_pb2_grpc.InferenceServiceStub(self.channels[address])
        try:
            status = await stub.GetStatus(inference_pb2.GetInferenceStatusRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            # Not kept: the gRPC broadcaster retries it and reports it down if it stays so.
            log.warning(
                "replica %s did not say how it takes weights (%s); trying gRPC", address, error.code().name
            )
            return "grpc"
        choice = self.choices[address] = choose_transport(self.device, self.node, status.weight_sync)
        log.info("weights reach replica %s over %s", address, choice)
        return choice

    async def broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        to: Sequence[str] | None = None,
        rollback: bool = False,
    ) -> list[ReplicaResult]:
        targets = list(self.channels) if to is None else list(to)
        unknown = [a for a in targets if a not in self.choices]
        chosen = dict(zip(unknown, await asyncio.gather(*(self._choose(a) for a in unknown)), strict=True))
        groups: dict[str, list[str]] = {}
        for address in targets:
            groups.setdefault(chosen.get(address) or self.choices[address], []).append(address)
        answers = await asyncio.gather(
            *(
                self.by_transport[t].broadcast(tensors, version, members, rollback)
                for t, members in groups.items()
            )
        )
        results = {r.address: r for answer in answers for r in answer}
        fetched = [a for t, members in groups.items() if t != "grpc" for a in members if not results[a].ok]
        if fetched:
            results.update(await self._fall_back(fetched, tensors, version, rollback, results))
        for result in results.values():
            if not result.ok:
                self.choices.pop(result.address, None)
        return [results[a] for a in targets]

    async def _fall_back(
        self,
        addresses: list[str],
        tensors: dict[str, torch.Tensor],
        version: int,
        rollback: bool,
        failed: dict[str, ReplicaResult],
    ) -> dict[str, ReplicaResult]:
        """The update again over the stream to replicas that failed a fetched transport (what
        they report can be wrong: a GPU they cannot map, a network NCCL cannot cross); one that
        takes it stays on gRPC."""
        for address in addresses:
            log.warning(
                "replica %s failed a %s update (%s); sending it over gRPC",
                address,
                self.choices.get(address),
                failed[address].error,
            )
        results = await self.by_transport["grpc"].broadcast(tensors, version, addresses, rollback)
        for result in results:
            if result.ok:
                self.choices[result.address] = "grpc"
        return {r.address: r for r in results}

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels.values()))
        await asyncio.gather(*(b.close() for b in self.by_transport.values()))


def nccl_host(config: RunConfig) -> str:
    if config.trainer.broadcast.nccl_host:
        return config.trainer.broadcast.nccl_host
    if config.trainer.address:
        return config.trainer.address.rsplit(":", 1)[0].strip("[]")
    return socket.gethostname()


def _collective(config: RunConfig, client: ClientOptions, addresses: list[str], backend: str):
    return CollectiveWeightBroadcaster(
        addresses,
        config.trainer.broadcast,
        client,
        host=nccl_host(config),
        backend=backend,
        ranks_per_replica=config.inference.vllm.tensor_parallel_size if backend == "pynccl" else 1,
        device=config.trainer.device,
    )


def make_broadcaster(config: RunConfig, client: ClientOptions) -> WeightBroadcaster:
    addresses = list(config.inference.addresses)
    settings = config.trainer.broadcast
    device = torch.device(config.trainer.device)
    transport = settings.transport
    if transport == "auto" and device.type != "cuda":
        transport = "grpc"
    if transport == "ipc":
        return IpcWeightBroadcaster(addresses, settings, client)
    if transport == "nccl":
        if config.inference.engine == "vllm":
            backend = "pynccl"
        else:
            backend = "nccl" if device.type == "cuda" else "gloo"
        return _collective(config, client, addresses, backend)
    if transport == "auto":
        by_transport: dict[str, WeightBroadcaster] = {
            "grpc": GrpcWeightBroadcaster(addresses, settings, client),
            "ipc": IpcWeightBroadcaster(addresses, settings, client),
            "nccl": _collective(config, client, addresses, "nccl"),
            "pynccl": _collective(config, client, addresses, "pynccl"),
        }
        return AutoWeightBroadcaster(addresses, by_transport, client, settings, device)
    return GrpcWeightBroadcaster(addresses, settings, client)


async def measure_sync(
    broadcaster: WeightBroadcaster, address: str, tensors: dict[str, torch.Tensor], rounds: int = 3
) -> list[ReplicaResult]:
    """Syncs `tensors` (the replica's model's tensor list, any values) to the served replica at
    `address` `rounds` times, each as the version after the replica's; one result per round
    (`bytes / seconds`: its throughput; the first round includes opening the transport).
    Raises RuntimeError naming the replica's error if a round fails."""
    channel = open_channel(address, ClientOptions())
    try:
        status = await inference_pb2_grpc.InferenceServiceStub(channel).GetStatus(
            inference_pb2.GetInferenceStatusRequest(), timeout=PROBE_TIMEOUT_S
        )
    finally:
        await channel.close()
    results = []
    for round_ in range(rounds):
        (result,) = await broadcaster.broadcast(tensors, status.policy_version + 1 + round_, [address])
        if not result.ok:
            raise RuntimeError(f"weight sync to {address} failed: {result.error}")
        results.append(result)
    return results
