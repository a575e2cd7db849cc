"""Which weight transport reaches which replica, and the broadcaster `trainer.broadcast.transport`
builds (`make_broadcaster`); the transports are `rlrun.common.weights`.

- "grpc": the chunk stream (`grpc_stream.GrpcWeightBroadcaster`); works everywhere, the CPU path.
- "ipc": the trainer's staging buffer mapped by replicas on its node
  (`ipc.IpcWeightBroadcaster`): CUDA IPC on a GPU, shared memory on CPU.
- "nccl": a collective (`collective.CollectiveWeightBroadcaster`): vLLM's
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
from dataclasses import dataclass

import grpc
import torch

from rlrun.common.config import RunConfig
from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.weights.collective import CollectiveWeightBroadcaster
from rlrun.common.weights.grpc_stream import GrpcWeightBroadcaster
from rlrun.common.weights.ipc import IpcWeightBroadcaster
from rlrun.common.weights.protocol import ReplicaChannels, WeightBroadcaster, WeightSender, node_id
from rlrun.common.wire.inference import status_from_proto, status_request
from rlrun.common.wire.trainer import BroadcastResult
from rlrun.common.wire.weights import Backend, WeightSyncInfo
from rlrun.v1 import inference_pb2_grpc

log = logging.getLogger("rlrun.trainer.weight_sync")

PROBE_TIMEOUT_S = 10.0


def choose_transport(trainer_device: torch.device, trainer_node: str, replica: WeightSyncInfo) -> str:
    """ "grpc", "ipc", "nccl" (torch.distributed) or "pynccl" (vLLM's communicator) for one
    replica, as "auto" picks it."""
    if trainer_device.type != "cuda":
        return "grpc"
    on_cuda = replica.device.startswith("cuda")
    if on_cuda and "ipc" in replica.transports and replica.node_id == trainer_node:
        return "ipc"
    if "nccl" in replica.transports:
        if on_cuda and "nccl" in replica.backends:
            return "nccl"
        if "pynccl" in replica.backends:
            return "pynccl"
    return "grpc"


class AutoWeightBroadcaster(ReplicaChannels):
    """Sends each replica the update over the transport `choose_transport` picks for it, all
    transports at once. A replica that fails an IPC or collective update gets it over gRPC at
    once (the fallback of those transports' senders), and stays on gRPC if that
    works. A replica's choice is kept until it fails an update (it may have come back
    elsewhere, or as another engine)."""

    tensors_on_cpu = False

    def __init__(
        self,
        addresses: list[str],
        by_transport: dict[str, WeightBroadcaster],
        client: ClientOptions,
        config: BroadcastConfig,
        device: torch.device,
    ):
        super().__init__(addresses, config, client)
        self.by_transport = by_transport
        stream = by_transport["grpc"]
        for transport, sender in by_transport.items():
            if transport != "grpc" and isinstance(sender, WeightSender) and isinstance(stream, WeightSender):
                sender.fallback = stream
        self.device = device
        self.node = node_id()
        self.choices: dict[str, str] = {}

    async def set_addresses(self, addresses: list[str]) -> None:
        await super().set_addresses(addresses)
        await asyncio.gather(*(b.set_addresses(addresses) for b in self.by_transport.values()))
        self.choices = {a: t for a, t in self.choices.items() if a in addresses}

    async def _choose(self, address: str) -> str:
        stub = inference_pb2_grpc.InferenceServiceStub(self.channels[address])
        try:
            # Within the update's own deadline: a stalled replica must not hold the broadcast longer.
            timeout = min(PROBE_TIMEOUT_S, self.config.timeout_s)
            status = status_from_proto(await stub.GetStatus(status_request(), timeout=timeout))
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
    ) -> list[BroadcastResult]:
        targets = self.targets(to)
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
        via = {a: t for t, members in groups.items() for a in members}
        for address, result in results.items():
            if not result.ok:
                self.choices.pop(address, None)
            elif via[address] != "grpc" and result.transport == "grpc":
                self.choices[address] = "grpc"  # it took the fallback: it stays there
        return [results[a] for a in targets]

    async def close(self) -> None:
        await super().close()
        await asyncio.gather(*(b.close() for b in self.by_transport.values()))


def nccl_host(config: RunConfig) -> str:
    if config.trainer.broadcast.nccl_host:
        return config.trainer.broadcast.nccl_host
    if config.trainer.address:
        return config.trainer.address.rsplit(":", 1)[0].strip("[]")
    return socket.gethostname()


@dataclass(frozen=True)
class SyncTarget:
    """Where the trainer's weights go, besides the replica addresses."""

    device: torch.device
    """The trainer's device (where the tensors it broadcasts live)."""
    host: str
    """Where replicas reach the trainer's rendezvous store (collectives)."""
    engine: str = "torch"
    """The replicas' inference engine: "vllm" joins its own NCCL communicator."""
    tensor_parallel_size: int = 1
    """vLLM workers per replica, each a rank of a collective."""


def _collective(
    addresses, settings, client, target: SyncTarget, backend: Backend
) -> CollectiveWeightBroadcaster:
    return CollectiveWeightBroadcaster(
        addresses,
        settings,
        client,
        host=target.host,
        backend=backend,
        ranks_per_replica=target.tensor_parallel_size if backend == "pynccl" else 1,
        device=target.device,
    )


def build_broadcaster(
    transport: str, addresses: list[str], settings: BroadcastConfig, client: ClientOptions, target: SyncTarget
) -> WeightBroadcaster:
    """The broadcaster for `transport` ("grpc", "ipc", "nccl" or "auto", as in
    `trainer.broadcast.transport`)."""
    if transport == "auto" and target.device.type != "cuda":
        transport = "grpc"
    if transport == "ipc":
        return IpcWeightBroadcaster(addresses, settings, client)
    if transport == "nccl":
        torch_backend: Backend = "nccl" if target.device.type == "cuda" else "gloo"
        backend: Backend = "pynccl" if target.engine == "vllm" else torch_backend
        return _collective(addresses, settings, client, target, backend)
    if transport == "auto":
        by_transport: dict[str, WeightBroadcaster] = {
            "grpc": GrpcWeightBroadcaster(addresses, settings, client),
            "ipc": IpcWeightBroadcaster(addresses, settings, client),
            "nccl": _collective(addresses, settings, client, target, "nccl"),
            "pynccl": _collective(addresses, settings, client, target, "pynccl"),
        }
        return AutoWeightBroadcaster(addresses, by_transport, client, settings, target.device)
    return GrpcWeightBroadcaster(addresses, settings, client)


def make_broadcaster(config: RunConfig, client: ClientOptions) -> WeightBroadcaster:
    target = SyncTarget(
        device=torch.device(config.trainer.device),
        host=nccl_host(config),
        engine=config.inference.engine,
        tensor_parallel_size=config.inference.vllm.tensor_parallel_size,
    )
    settings = config.trainer.broadcast
    return build_broadcaster(settings.transport, list(config.inference.addresses), settings, client, target)


async def measure_sync(
    address: str,
    tensors: dict[str, torch.Tensor],
    transport: str = "auto",
    rounds: int = 3,
    engine: str = "torch",
    host: str = "127.0.0.1",
) -> list[BroadcastResult]:
    """Syncs `tensors` from this process (their device is the trainer's) to the served replica
    at `address` over `transport` ("grpc", "ipc", "nccl", "auto"), `rounds` times, each as the
    version after the replica's; one result per round: `bytes / seconds` is its throughput
    (the first round includes opening the transport: staging buffer, handle, group). `tensors`
    must be the replica's tensor list (names, dtypes, shapes); their values are free. `engine`:
    the replica's; `host`: where it reaches this process's rendezvous store ("nccl"). Raises
    RuntimeError naming the replica's error if a round fails."""
    client = ClientOptions()
    channel = open_channel(address, client)
    try:
        status = status_from_proto(
            await inference_pb2_grpc.InferenceServiceStub(channel).GetStatus(
                status_request(), timeout=PROBE_TIMEOUT_S
            )
        )
    finally:
        await channel.close()
    device = next(iter(tensors.values())).device
    target = SyncTarget(device=device, host=host, engine=engine)
    broadcaster = build_broadcaster(transport, [address], BroadcastConfig(retries=0), client, target)
    results = []
    try:
        for round_ in range(rounds):
            (result,) = await broadcaster.broadcast(tensors, status.policy_version + 1 + round_, [address])
            if not result.ok:
                raise RuntimeError(f"weight sync to {address} over {transport} failed: {result.error}")
            results.append(result)
    finally:
        await broadcaster.close()
    return results
