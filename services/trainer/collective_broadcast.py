"""Weight broadcast over a collective (`trainer.broadcast.transport = "nccl"`, GPU clusters).

The tensor bytes travel over an NCCL broadcast from the trainer (rank 0) to the inference
workers; gRPC only carries the handshake. Per update:

1. Probe every replica (GetStatus, UNAVAILABLE retried). Live ones are given ranks in address
   order, each replica as many as its tensor-parallel workers (`ranks_per_replica`): replica i
   starts at rank 1 + i * ranks_per_replica. Dead ones are reported and left out, so they
   cannot stall the collective.
2. Send each live replica an UpdateWeights stream holding only a header with
   `transport = WEIGHT_TRANSPORT_NCCL` and `nccl = NcclRendezvous{host, port, world_size,
   rank (the replica's first rank), group_name}` (the checksum is 0: the bytes never pass
   through the CPU).
3. Join the group as rank 0 (hosting its rendezvous store at host:port) and broadcast every
   tensor in header order. For a torch group, a replica that refuses its header (it answers
   at once and never joins) ends the trainer's wait for the receivers at once.
4. Each replica answers its UpdateWeights call once it has received and loaded the tensors.

A group is reused while the set of live replicas stays the same; a new set, or a failed
transfer, makes a new group under a new name (and port, unless `nccl_port` pins it).
Receivers join when the rendezvous they are sent differs from the one they joined last.

`join_weight_group` (`rlrun.common.model.weight_groups`) is the one way both sides join:
"pynccl" (vLLM's communicator), "nccl" (a standalone torch.distributed NCCL group) or "gloo"
(the same over CPU tensors: tests, no GPU needed), named in the header's `nccl.backend`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import grpc
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.model.weight_groups import BACKENDS, WeightGroup, join_weight_group
from rlrun.common.model.weights import TORCH_TO_PB
from rlrun.trainer.broadcast import ReplicaChannels, ReplicaResult, retry_unavailable
from rlrun.v1 import inference_pb2, inference_pb2_grpc, weights_pb2

log = logging.getLogger("rlrun.trainer.collective_broadcast")

PROBE_TIMEOUT_S = 10.0


def header_for(
    tensors: dict[str, torch.Tensor], version: int, rollback: bool = False
) -> weights_pb2.WeightUpdateHeader:
    return weights_pb2.WeightUpdateHeader(
        rollback=rollback,
        version=version,
        tensors=[
            weights_pb2.TensorSpec(name=n, dtype=TORCH_TO_PB[t.dtype], shape=list(t.shape))
            for n, t in tensors.items()
        ],
        total_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        transport=weights_pb2.WEIGHT_TRANSPORT_NCCL,
    )


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _abort_on_refusal(abort: threading.Event, handshake: asyncio.Future) -> None:
    if not handshake.cancelled() and handshake.result()[0]:
        abort.set()


@dataclass
class _Group:
    name: str
    port: int
    members: tuple[str, ...]
    world_size: int
    joined: WeightGroup | None = None
    """Set by the first transfer: joining blocks until the replicas join too."""


class CollectiveWeightBroadcaster(ReplicaChannels):
    def __init__(
        self,
        addresses: list[str],
        config: BroadcastConfig,
        client: ClientOptions,
        host: str,
        backend: str = "pynccl",
        ranks_per_replica: int = 1,
        device: str | torch.device = "cuda",
    ):
        super().__init__(addresses, config, client)
        self.host = host
        self.backend = backend
        self.ranks_per_replica = ranks_per_replica
        self.device = torch.device(device)
        self.timeout = timedelta(seconds=config.timeout_s)
        self.generation = 0
        self.group: _Group | None = None

    @property
    def tensors_on_cpu(self) -> bool:
        return self.backend == "gloo"

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
            self.group = _Group(
                name=f"rlrun-weights-{self.generation}",
                port=self.config.nccl_port or free_port(self.host),
                members=live,
                world_size=1 + len(live) * self.ranks_per_replica,
            )
        return self.group

    def _transfer(self, group: _Group, tensors: dict[str, torch.Tensor], abort: threading.Event) -> None:
        if group.joined is None:
            group.joined = join_weight_group(
                self.backend, self.host, group.port, 0, group.world_size, self.device, self.timeout, abort
            )
        for tensor in tensors.values():
            group.joined.broadcast(tensor.contiguous())
        if self.backend != "gloo":
            torch.cuda.synchronize(self.device)

    async def _handshake(self, address: str, header: weights_pb2.WeightUpdateHeader) -> tuple[str, float]:
        stub = inference_pb2_grpc.InferenceServiceStub(self.channels[address])
        started = time.perf_counter()
        try:
            await stub.UpdateWeights(
                iter([weights_pb2.WeightUpdateMessage(header=header)]), timeout=self.config.timeout_s
            )
            return "", time.perf_counter() - started
        except grpc.aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}", time.perf_counter() - started
        except Exception as error:  # reported per replica, never raised: the others go on
            return f"{type(error).__name__}: {error}", time.perf_counter() - started

    # set_addresses (ReplicaChannels): the next update forms a group of the new set.

    async def broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        to: Sequence[str] | None = None,
        rollback: bool = False,
    ) -> list[ReplicaResult]:
        """`to`: a subset (a replica re-synced after a restart) forms a group of its own for
        this update; the next full update forms the full group again."""
        targets = self.targets(to)
        if not targets:
            return []
        probes = dict(zip(targets, await asyncio.gather(*(self._probe(a) for a in targets)), strict=True))
        results = {
            a: ReplicaResult(address=a, ok=False, error=f"not reachable: {e}") for a, e in probes.items() if e
        }
        live = tuple(a for a, e in probes.items() if not e)
        if live:
            group = self._group_for(live)
            base = header_for(tensors, version, rollback)
            handshakes = []
            for index, address in enumerate(live):
                header = weights_pb2.WeightUpdateHeader()
                header.CopyFrom(base)
                header.nccl.CopyFrom(
                    weights_pb2.NcclRendezvous(
                        host=self.host,
                        port=group.port,
                        world_size=group.world_size,
                        rank=1 + index * self.ranks_per_replica,
                        group_name=group.name,
                        backend=BACKENDS[self.backend],
                    )
                )
                handshakes.append(asyncio.ensure_future(self._handshake(address, header)))
            # A replica that refuses the header answers at once and never joins: stop waiting.
            abort = threading.Event()
            for handshake in handshakes:
                handshake.add_done_callback(functools.partial(_abort_on_refusal, abort))
            transfer_error = ""
            try:
                await asyncio.to_thread(self._transfer, group, tensors, abort)
            except Exception as error:  # the group is unusable now; the next update makes a new one
                transfer_error = f"collective transfer failed: {type(error).__name__}: {error}"
                log.error("%s", transfer_error)
            for address, (error, seconds) in zip(live, await asyncio.gather(*handshakes), strict=True):
                error = error or transfer_error  # a replica's own refusal names the cause
                results[address] = ReplicaResult(
                    address=address,
                    ok=not error,
                    error=error,
                    seconds=seconds,
                    bytes=0 if error else base.total_bytes,
                )
            if any(not results[a].ok for a in live):
                self.group = None
        return [results[a] for a in targets]
