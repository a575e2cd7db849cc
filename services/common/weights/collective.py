"""The collective transport (`trainer.broadcast.transport = "nccl"`, GPU clusters): the tensor
bytes travel over a broadcast from the trainer (rank 0) to the inference workers; gRPC only
carries the handshake. Both halves.

Sending (`CollectiveWeightBroadcaster`), per update:
1. Probe every replica (GetStatus, UNAVAILABLE retried). Live ones are given ranks in address
   order, each replica as many as its tensor-parallel workers (`ranks_per_replica`): replica i
   starts at rank 1 + i * ranks_per_replica. Dead ones are reported and left out, so they
   cannot stall the collective.
2. Send each live replica an UpdateWeights stream holding only a header with
   `transport = nccl` and `nccl = NcclRendezvous{host, port, world_size, rank (the replica's
   first rank), group_name, backend}` (the checksum is 0: the bytes never pass through the CPU).
3. Join the group as rank 0 (hosting its rendezvous store at host:port) and broadcast every
   tensor in header order. For a torch group, a replica that refuses its header (it answers
   at once and never joins) ends the trainer's wait for the receivers at once.
4. Each replica answers its UpdateWeights call once it has received and loaded the tensors.

A group is reused while the set of live replicas stays the same; a new set, or a failed
transfer, makes a new group under a new name (and port, unless `nccl_port` pins it).
Receivers join when the rendezvous they are sent differs from the one they joined last.

Receiving: the torch engine checks the header (`collective_source`) and its core joins the
group and receives into buffers of its own (`CollectiveReceiver`); the vLLM engine's workers
join with the same `join_weight_group` (`inference.engines.vllm_worker`). Backends (both sides
build the same kind, named in the header): "pynccl" (vLLM's communicator), "nccl" (a standalone
torch.distributed NCCL group) or "gloo" (the same over CPU tensors: tests, no GPU needed).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta

import grpc
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.errors import RequestError
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.weights.groups import WeightGroup, join_weight_group
from rlrun.common.weights.protocol import (
    Opened,
    Specs,
    TensorLayout,
    Update,
    WeightSender,
    WeightSource,
    retry_unavailable,
    synchronize,
    tensor_specs,
    total_bytes,
)
from rlrun.common.wire.inference import status_from_proto, status_request
from rlrun.common.wire.weights import Backend, NcclRendezvous, WeightUpdateHeader

log = logging.getLogger("rlrun.trainer.collective_broadcast")

PROBE_TIMEOUT_S = 10.0

COLLECTIVE_TIMEOUT_S = 120.0
"""How long joining a weight group, or one transfer over it, may take on the receiving side
(the trainer's default `trainer.broadcast.timeout_s`). The engine's decode loop waits that
long at worst."""

TORCH_BACKENDS = ("nccl", "gloo")
"""The backends a torch engine joins (torch.distributed groups)."""


# ---- the sending half -----------------------------------------------------------------------


def header_for(tensors: dict[str, torch.Tensor], version: int, rollback: bool = False) -> WeightUpdateHeader:
    return WeightUpdateHeader(
        version=version,
        tensors=tensor_specs(tensors),
        total_bytes=total_bytes(tensors),
        transport="nccl",
        rollback=rollback,
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


@dataclass
class CollectiveUpdate(Update):
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    header: WeightUpdateHeader | None = None
    group: _Group | None = None


class CollectiveWeightBroadcaster(WeightSender):
    transport = "nccl"

    def __init__(
        self,
        addresses: list[str],
        config: BroadcastConfig,
        client: ClientOptions,
        host: str,
        backend: Backend = "pynccl",
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
    def tensors_on_cpu(self) -> bool:  # type: ignore[override]
        return self.backend == "gloo"

    async def _probe(self, address: str) -> str:
        """ "" when the replica answers, else the error."""
        timeout = min(PROBE_TIMEOUT_S, self.config.timeout_s)

        async def attempt():
            return status_from_proto(await self.stub(address).GetStatus(status_request(), timeout=timeout))

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

    async def prepare(self, tensors, version, rollback, targets) -> CollectiveUpdate:
        """`targets` a subset (a replica re-synced after a restart): a group of its own for this
        update; the next full update forms the full group again."""
        probes = dict(zip(targets, await asyncio.gather(*(self._probe(a) for a in targets)), strict=True))
        update = CollectiveUpdate(
            version, total_bytes(tensors), left_out={a: e for a, e in probes.items() if e}, tensors=tensors
        )
        live = tuple(a for a, e in probes.items() if not e)
        if live:
            update.group = self._group_for(live)
            update.header = header_for(tensors, version, rollback)
        return update

    async def send(self, address: str, update: Update) -> None:
        assert isinstance(update, CollectiveUpdate) and update.header is not None and update.group is not None
        group = update.group
        rendezvous = NcclRendezvous(
            host=self.host,
            port=group.port,
            world_size=group.world_size,
            rank=1 + group.members.index(address) * self.ranks_per_replica,
            group_name=group.name,
            backend=self.backend,
        )
        await self.update_weights(address, replace(update.header, nccl=rendezvous))

    async def _handshake(self, address: str, update: Update) -> tuple[str, float]:
        """A handshake is not retried (the probe was): the group waits for this replica."""
        started = time.perf_counter()
        try:
            await self.send(address, update)
            return "", time.perf_counter() - started
        except grpc.aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}", time.perf_counter() - started
        except Exception as error:  # reported per replica, never raised: the others go on
            return f"{type(error).__name__}: {error}", time.perf_counter() - started

    async def send_all(self, update: Update, addresses: list[str]) -> dict[str, tuple[str, float]]:
        """Every handshake while the trainer transfers: a replica's own refusal names the
        cause, else the transfer's failure does."""
        assert isinstance(update, CollectiveUpdate) and update.group is not None
        handshakes = [asyncio.ensure_future(self._handshake(a, update)) for a in addresses]
        # A replica that refuses the header answers at once and never joins: stop waiting.
        abort = threading.Event()
        for handshake in handshakes:
            handshake.add_done_callback(functools.partial(_abort_on_refusal, abort))
        transfer_error = ""
        try:
            await asyncio.to_thread(self._transfer, update.group, update.tensors, abort)
        except Exception as error:  # the group is unusable now; the next update makes a new one
            transfer_error = f"collective transfer failed: {type(error).__name__}: {error}"
            log.error("%s", transfer_error)
        outcomes = await asyncio.gather(*handshakes)
        return {
            a: (error or transfer_error, seconds)
            for a, (error, seconds) in zip(addresses, outcomes, strict=True)
        }

    def discard(self, update: Update) -> None:
        self.group = None


# ---- the receiving half ---------------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveSource:
    backend: str
    host: str
    port: int
    world_size: int
    rank: int
    group_name: str
    specs: Specs

    @property
    def group(self) -> tuple:
        return (self.backend, self.host, self.port, self.world_size, self.rank, self.group_name)


def collective_source(
    header: WeightUpdateHeader, expected: dict[str, torch.Tensor], device: torch.device
) -> CollectiveSource:
    """The checked source of a collective update, for a torch engine on `device`."""
    rendezvous = header.nccl
    if rendezvous is None:
        raise RequestError("header.nccl", "an NCCL update needs header.nccl (the rendezvous)")
    if rendezvous.backend not in TORCH_BACKENDS:
        raise RequestError(
            "header.nccl.backend",
            f"the torch engine joins torch.distributed groups (nccl, gloo), not {rendezvous.backend}",
        )
    if rendezvous.backend == "nccl" and device.type != "cuda":
        raise RequestError(
            "header.nccl.backend", f"an NCCL group needs a CUDA engine; this one is on {device}"
        )
    if not 0 < rendezvous.rank < rendezvous.world_size:
        raise RequestError(
            "header.nccl.rank", f"rank {rendezvous.rank} is not a receiver of {rendezvous.world_size} ranks"
        )
    layout = TensorLayout(header.tensors, expected)
    layout.check_total(header)
    return CollectiveSource(
        backend=rendezvous.backend,
        host=rendezvous.host,
        port=rendezvous.port,
        world_size=rendezvous.world_size,
        rank=rendezvous.rank,
        group_name=rendezvous.group_name,
        specs=layout.specs,
    )


class CollectiveReceiver:
    """Lives in the process that holds the parameters (on `device`): joins weight groups and
    keeps the group and its receive buffers for the next update."""

    def __init__(self, device: torch.device):
        self.device = device
        self._group: tuple[tuple, WeightGroup] | None = None
        self._received: tuple[Specs, dict[str, torch.Tensor]] | None = None
        """Receive buffers, made once per tensor list."""

    def source(self, source: CollectiveSource) -> WeightSource:
        return Opened(lambda: self._receive(source), (self.device,))

    def _buffers(self, specs: Specs) -> dict[str, torch.Tensor]:
        if self._received is None or self._received[0] != specs:
            self._received = (
                specs,
                {name: torch.empty(shape, dtype=dtype, device=self.device) for name, dtype, shape in specs},
            )
        return self._received[1]

    def _receive(self, source: CollectiveSource) -> dict[str, torch.Tensor]:
        try:
            if self._group is None or self._group[0] != source.group:
                self._group = None
                joined = join_weight_group(
                    source.backend,
                    source.host,
                    source.port,
                    source.rank,
                    source.world_size,
                    self.device,
                    timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                )
                self._group = (source.group, joined)
            group = self._group[1]
            buffers = self._buffers(source.specs)
            for name, _, _ in source.specs:
                group.broadcast(buffers[name])
            synchronize(self.device)
        except (RuntimeError, OSError, ValueError) as error:
            self._group = None  # unusable now; the trainer forms a new group next time
            raise RequestError(
                "header.nccl", f"the transfer over weight group {source.group_name} failed: {error}"
            ) from error
        return buffers
