"""Weight broadcast over a collective (`trainer.broadcast.transport = "nccl"`, GPU clusters).

The tensor bytes travel over an NCCL broadcast from the trainer (rank 0) to the replicas
(ranks 1..k); gRPC only carries the handshake. Per update:

1. Probe every replica (GetStatus, UNAVAILABLE retried). Live ones get ranks 1..k in address
   order; dead ones are reported and left out, so they cannot stall the collective.
2. Send each live replica an UpdateWeights stream holding only a header with
   `transport = WEIGHT_TRANSPORT_NCCL` and `nccl = NcclRendezvous{host, port, world_size,
   rank, group_name}` (the checksum is 0: the bytes never pass through the CPU).
3. Join the group (rank 0) and broadcast every tensor in header order, from rank 0.
4. Each replica answers its UpdateWeights call once it has received and applied the tensors.

The rendezvous store (a TCPStore hosted by the trainer) lives as long as the trainer; a group
is keyed by `group_name` under it and reused while the set of live replicas stays the same. A
new set, or a failed transfer, starts a new group name. Receivers therefore join a group the
first time they see its name, reuse it while the name repeats, and, for every update:
allocate each header tensor (dtype, shape) on their GPU, call
`ProcessGroupNCCL.broadcast([tensor], BroadcastOptions(rootRank=0))` in header order, and
load the tensors, which are named as in a gRPC update.

`backend = "gloo"` runs the very same protocol on CPU tensors (tests, no GPU needed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.model.weights import TORCH_TO_PB
from rlrun.trainer.broadcast import ReplicaResult, replica_client_options, retry_unavailable
from rlrun.v1 import inference_pb2, inference_pb2_grpc, weights_pb2

log = logging.getLogger("rlrun.trainer.collective_broadcast")

PROBE_TIMEOUT_S = 10.0


def new_process_group(backend: str, store: dist.Store, rank: int, world_size: int, timeout: timedelta):
    """A process group outside torch.distributed's default world (the replicas are not part
    of the trainer's torchrun job). Gloo connects here; NCCL on its first collective."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    raise ValueError(f"unknown weight-broadcast backend {backend!r}")


def header_for(tensors: dict[str, torch.Tensor], version: int) -> weights_pb2.WeightUpdateHeader:
    return weights_pb2.WeightUpdateHeader(
        version=version,
        tensors=[
            weights_pb2.TensorSpec(name=n, dtype=TORCH_TO_PB[t.dtype], shape=list(t.shape))
            for n, t in tensors.items()
        ],
        total_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        transport=weights_pb2.WEIGHT_TRANSPORT_NCCL,
    )


@dataclass
class _Group:
    name: str
    members: tuple[str, ...]
    process_group: object | None = None
    """Created by the first transfer (gloo connects on creation, so it must run while the
    receivers are joining)."""


class CollectiveWeightBroadcaster:
    def __init__(
        self,
        addresses: list[str],
        config: BroadcastConfig,
        client: ClientOptions,
        host: str,
        backend: str = "nccl",
    ):
        self.config = config
        self.host = host
        self.backend = backend
        self.timeout = timedelta(seconds=config.timeout_s)
        options = replica_client_options(client, config)
        self.channels = {address: open_channel(address, options) for address in addresses}
        self.store = dist.TCPStore(
            host, config.nccl_port, is_master=True, wait_for_workers=False, timeout=self.timeout
        )
        self.generation = 0
        self.group: _Group | None = None

    @property
    def tensors_on_cpu(self) -> bool:
        return self.backend == "gloo"

    @property
    def port(self) -> int:
        return self.store.port

    async def _probe(self, address: str) -> str:
        """ "" when the replica answers, else the error."""
        stub = inference_pb2_grpc.InferenceServiceStub(self.channels[address])
        timeout = min(PROBE_TIMEOUT_S, self.config.timeout_s)

        async def attempt():
            return await stub.GetStatus(inference_pb2.GetInferenceStatusRequest(), timeout=timeout)

        _, error = await retry_unavailable(address, attempt, self.config.retries)
        return error

    def _group_for(self, live: tuple[str, ...]) -> _Group:
        if self.group is None or self.group.members != live:
            self.generation += 1
            self.group = _Group(name=f"rlrun-weights-{self.generation}", members=live)
        return self.group

    def _transfer(self, group: _Group, tensors: dict[str, torch.Tensor]) -> None:
        if group.process_group is None:
            store = dist.PrefixStore(group.name, self.store)
            group.process_group = new_process_group(
                self.backend, store, 0, len(group.members) + 1, self.timeout
            )
        for tensor in tensors.values():
            group.process_group.broadcast([tensor.contiguous()], dist.BroadcastOptions()).wait()
        if self.backend == "nccl":
            torch.cuda.synchronize()

    async def _handshake(self, address: str, header: weights_pb2.WeightUpdateHeader) -> tuple[str, float]:
        stub = inference_pb2_grpc.InferenceServiceStub(self.channels[address])
        started = time.perf_counter()
        try:
            await stub.UpdateWeights(
                iter([weights_pb2.WeightUpdateMessage(header=header)]), timeout=self.config.timeout_s
            )
            return "", time.perf_counter() - started
        except Exception as error:  # reported per replica, never raised: the others go on
            return f"{type(error).__name__}: {error}", time.perf_counter() - started

    async def broadcast(self, tensors: dict[str, torch.Tensor], version: int) -> list[ReplicaResult]:
        if not self.channels:
            return []
        probes = dict(
            zip(self.channels, await asyncio.gather(*(self._probe(a) for a in self.channels)), strict=True)
        )
        results = {
            a: ReplicaResult(address=a, ok=False, error=f"not reachable: {e}") for a, e in probes.items() if e
        }
        live = tuple(a for a, e in probes.items() if not e)
        if live:
            group = self._group_for(live)
            base = header_for(tensors, version)
            handshakes = []
            for rank, address in enumerate(live, start=1):
                header = weights_pb2.WeightUpdateHeader()
                header.CopyFrom(base)
                header.nccl.CopyFrom(
                    weights_pb2.NcclRendezvous(
                        host=self.host,
                        port=self.port,
                        world_size=len(live) + 1,
                        rank=rank,
                        group_name=group.name,
                    )
                )
                handshakes.append(asyncio.ensure_future(self._handshake(address, header)))
            transfer_error = ""
            try:
                await asyncio.to_thread(self._transfer, group, tensors)
            except Exception as error:  # the group is unusable now; the next update makes a new one
                transfer_error = f"collective transfer failed: {type(error).__name__}: {error}"
                log.error("%s", transfer_error)
                self.group = None
            for address, (error, seconds) in zip(live, await asyncio.gather(*handshakes), strict=True):
                error = transfer_error or error
                if error:
                    self.group = None
                results[address] = ReplicaResult(
                    address=address,
                    ok=not error,
                    error=error,
                    seconds=seconds,
                    bytes=0 if error else base.total_bytes,
                )
        return [results[a] for a in self.channels]

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels.values()))
