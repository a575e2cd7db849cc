"""Weight updates whose bytes do not travel in the UpdateWeights stream: the header names
where they are, and the replica fetches them itself.

- IPC (`WEIGHT_TRANSPORT_IPC`): the trainer keeps a staging buffer that this process maps
  (a CUDA IPC handle, or a shared-memory object on CPU, as torch.multiprocessing shares
  storages) and copies from between two decode steps.
- Collective (`WEIGHT_TRANSPORT_NCCL` with a torch backend): a standalone torch.distributed
  group (NCCL, or gloo on CPU) over the trainer's rendezvous store, received into buffers of
  the replica's own and copied in between two decode steps.

The front end checks the header (`ipc_source`, `collective_source`: every name, dtype, shape,
offset and size before anything is opened) and hands a plain, picklable source to the process
where the parameters live; there a `WeightReceiver` opens it (`WeightSource.open`), the core
copies it into the parameters, and `copied` waits until the sender's memory is free again.
Handles are never unpickled from the wire: each field has its own proto field, and only a
storage is rebuilt from them. A source that cannot be opened, or a transfer that fails,
raises `RequestError` before any parameter is written, so a failed update changes nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch

from rlrun.common.errors import RequestError
from rlrun.common.model.weight_groups import TORCH_BACKENDS, WeightGroup, join_weight_group, node_id
from rlrun.common.model.weights import TensorLayout
from rlrun.v1 import weights_pb2

COLLECTIVE_TIMEOUT_S = 120.0
"""How long joining a weight group, or one transfer over it, may take (the trainer's default
`trainer.broadcast.timeout_s`). The engine's decode loop waits that long at worst."""

CUDA_IPC_EVENT_HANDLE_BYTES = 64
"""sizeof(cudaIpcEventHandle_t)."""

MAX_CUDA_HANDLE_BYTES = 4096
"""An allocation's handle is torch's versioned encoding (a cudaIpcMemHandle_t, or an
expandable segment's handles); torch parses it, this only bounds it."""

_SHM_NAME = re.compile(r"/torch_\d+_\d+_\d+")
"""The shared-memory objects torch's file_system strategy creates (and nothing else)."""

Specs = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]


def sync_info(device: torch.device) -> weights_pb2.WeightSyncInfo:
    """What a torch-engine replica on `device` accepts."""
    backends = [weights_pb2.COLLECTIVE_BACKEND_TORCH_GLOO]
    if device.type == "cuda":
        backends.append(weights_pb2.COLLECTIVE_BACKEND_TORCH_NCCL)
    return weights_pb2.WeightSyncInfo(
        node_id=node_id(),
        device=str(device),
        transports=[
            weights_pb2.WEIGHT_TRANSPORT_GRPC,
            weights_pb2.WEIGHT_TRANSPORT_IPC,
            weights_pb2.WEIGHT_TRANSPORT_NCCL,
        ],
        backends=backends,
    )


class WeightSource(Protocol):
    """An update the core fetches itself (`torch_core.ApplyWeights`)."""

    def open(self) -> Mapping[str, torch.Tensor]:
        """Every tensor of the model, checked against it; raises RequestError having
        written nothing."""
        ...

    def copied(self) -> None:
        """Called once the copy into the parameters is issued: returns when the source's
        memory may be written again (the sender reuses it once the replica answers)."""
        ...


def _specs(layout: TensorLayout) -> Specs:
    return tuple((name, dtype, shape) for name, dtype, shape, _ in layout.entries)


@dataclass(frozen=True)
class IpcSource:
    buffer_id: str
    size: int
    offsets: tuple[int, ...]
    specs: Specs
    cuda: tuple | None
    """The arguments of `UntypedStorage._new_shared_cuda`, in its order."""
    shared_memory: tuple[bytes, bytes] | None
    """(manager socket, object name) for `UntypedStorage._new_shared_filename_cpu`."""


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


def _check_total(header: weights_pb2.WeightUpdateHeader, layout: TensorLayout) -> None:
    if header.total_bytes != layout.total_bytes:
        raise RequestError(
            "header.total_bytes",
            f"header.total_bytes is {header.total_bytes} but the tensors need {layout.total_bytes}",
        )


def _check_offsets(ipc: weights_pb2.IpcBuffer, layout: TensorLayout) -> None:
    if len(ipc.offsets) != len(layout.entries):
        raise RequestError(
            "header.ipc.offsets",
            f"header.ipc.offsets has {len(ipc.offsets)} entries for {len(layout.entries)} tensors",
        )
    end = 0
    for i, (offset, (name, dtype, _, count)) in enumerate(zip(ipc.offsets, layout.entries, strict=True)):
        if offset < end or offset % dtype.itemsize:
            raise RequestError(
                f"header.ipc.offsets[{i}]",
                f"tensor {name} at byte {offset} overlaps the one before it or is not aligned to {dtype}",
            )
        end = offset + count * dtype.itemsize
    if end > ipc.size_bytes:
        raise RequestError(
            "header.ipc.size_bytes", f"the tensors end at byte {end}, the buffer has {ipc.size_bytes}"
        )


def _cuda_handle(handle: weights_pb2.CudaIpcHandle) -> tuple:
    if not 0 < len(handle.handle) <= MAX_CUDA_HANDLE_BYTES:
        raise RequestError("header.ipc.cuda.handle", f"must have 1 to {MAX_CUDA_HANDLE_BYTES} bytes")
    if len(handle.event_handle) != CUDA_IPC_EVENT_HANDLE_BYTES:
        raise RequestError(
            "header.ipc.cuda.event_handle", f"a CUDA IPC event handle has {CUDA_IPC_EVENT_HANDLE_BYTES} bytes"
        )
    if handle.storage_size_bytes < 0 or handle.storage_offset_bytes < 0 or handle.device < 0:
        raise RequestError("header.ipc.cuda", "device, storage size and offset must be >= 0")
    return (
        handle.device,
        handle.handle,
        handle.storage_size_bytes,
        handle.storage_offset_bytes,
        handle.ref_counter_handle,
        handle.ref_counter_offset,
        handle.event_handle,
        handle.event_sync_required,
    )


def _shared_memory_handle(handle: weights_pb2.SharedMemoryHandle) -> tuple[bytes, bytes]:
    if not _SHM_NAME.fullmatch(handle.name):
        raise RequestError(
            "header.ipc.shared_memory.name", f"{handle.name!r} is not a torch shared-memory object name"
        )
    if not os.path.isabs(handle.manager) or "\0" in handle.manager:
        raise RequestError("header.ipc.shared_memory.manager", "must be the absolute path of a socket")
    return handle.manager.encode(), handle.name.encode()


def ipc_source(header: weights_pb2.WeightUpdateHeader, expected: dict[str, torch.Tensor]) -> IpcSource:
    """The checked source of an IPC update against the model's tensors `expected`."""
    if not header.HasField("ipc"):
        raise RequestError("header.ipc", "an IPC update needs header.ipc (the staging buffer)")
    ipc = header.ipc
    layout = TensorLayout(header.tensors, expected)
    _check_total(header, layout)
    if not ipc.buffer_id:
        raise RequestError("header.ipc.buffer_id", "header.ipc.buffer_id must be set")
    _check_offsets(ipc, layout)
    kind = ipc.WhichOneof("handle")
    if kind is None:
        raise RequestError("header.ipc", "header.ipc needs a cuda or shared_memory handle")
    return IpcSource(
        buffer_id=ipc.buffer_id,
        size=ipc.size_bytes,
        offsets=tuple(ipc.offsets),
        specs=_specs(layout),
        cuda=_cuda_handle(ipc.cuda) if kind == "cuda" else None,
        shared_memory=_shared_memory_handle(ipc.shared_memory) if kind == "shared_memory" else None,
    )


def collective_source(
    header: weights_pb2.WeightUpdateHeader, expected: dict[str, torch.Tensor], device: torch.device
) -> CollectiveSource:
    """The checked source of a collective update, for a torch engine on `device`."""
    if not header.HasField("nccl"):
        raise RequestError("header.nccl", "an NCCL update needs header.nccl (the rendezvous)")
    rendezvous = header.nccl
    backend = TORCH_BACKENDS.get(rendezvous.backend)
    if backend is None:
        raise RequestError(
            "header.nccl.backend",
            f"the torch engine joins torch.distributed groups (TORCH_NCCL, TORCH_GLOO), not "
            f"{weights_pb2.CollectiveBackend.Name(rendezvous.backend)}",
        )
    if backend == "nccl" and device.type != "cuda":
        raise RequestError(
            "header.nccl.backend", f"an NCCL group needs a CUDA engine; this one is on {device}"
        )
    if not 0 < rendezvous.rank < rendezvous.world_size:
        raise RequestError(
            "header.nccl.rank", f"rank {rendezvous.rank} is not a receiver of {rendezvous.world_size} ranks"
        )
    layout = TensorLayout(header.tensors, expected)
    _check_total(header, layout)
    return CollectiveSource(
        backend=backend,
        host=rendezvous.host,
        port=rendezvous.port,
        world_size=rendezvous.world_size,
        rank=rendezvous.rank,
        group_name=rendezvous.group_name,
        specs=_specs(layout),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Opened:
    """One update's tensors, ready for the core to copy."""

    def __init__(
        self, open_tensors: Callable[[], Mapping[str, torch.Tensor]], devices: tuple[torch.device, ...]
    ):
        self._open = open_tensors
        self._devices = devices

    def open(self) -> Mapping[str, torch.Tensor]:
        return self._open()

    def copied(self) -> None:
        for device in self._devices:
            _sync(device)


class WeightReceiver:
    """Lives in the process that holds the parameters (on `device`): opens IPC buffers and
    joins weight groups, and keeps both for the next update."""

    def __init__(self, device: torch.device):
        self.device = device
        self._buffer: tuple[str, torch.Tensor] | None = None
        """(buffer id, the mapped staging buffer as bytes)."""
        self._group: tuple[tuple, WeightGroup] | None = None
        self._received: tuple[Specs, dict[str, torch.Tensor]] | None = None
        """Receive buffers of collective updates, made once per tensor list."""

    def source(self, source: IpcSource | CollectiveSource) -> WeightSource:
        if isinstance(source, IpcSource):
            # Copy from the trainer's memory, then wait for the copy: its device and ours.
            return _Opened(lambda: self._ipc_views(source), (self._ipc_device(source), self.device))
        return _Opened(lambda: self._receive(source), (self.device,))

    # -- IPC ---------------------------------------------------------------------------------------

    def _ipc_device(self, source: IpcSource) -> torch.device:
        return torch.device("cuda", source.cuda[0]) if source.cuda is not None else torch.device("cpu")

    def _map(self, source: IpcSource) -> torch.Tensor:
        if self._buffer is not None and self._buffer[0] == source.buffer_id:
            return self._buffer[1]
        self._buffer = None  # the old buffer is released: the trainer retired it
        try:
            if source.cuda is not None:
                torch.cuda._lazy_init()
                storage = torch.UntypedStorage._new_shared_cuda(*source.cuda)
            else:
                assert source.shared_memory is not None  # ipc_source sets a cuda or a shared_memory handle
                manager, name = source.shared_memory
                # Mapping past the object's end would be a SIGBUS at the copy, not an error here.
                available = os.stat(f"/dev/shm{name.decode()}").st_size
                if available < source.size:
                    raise RequestError(
                        "header.ipc.size_bytes",
                        f"the shared-memory object holds {available} bytes, not {source.size}",
                    )
                storage = torch.UntypedStorage._new_shared_filename_cpu(manager, name, source.size)
        except (RuntimeError, OSError) as error:
            raise RequestError(
                "header.ipc", f"cannot open staging buffer {source.buffer_id}: {error}"
            ) from error
        if storage.nbytes() < source.size:
            raise RequestError(
                "header.ipc.size_bytes",
                f"the shared buffer holds {storage.nbytes()} bytes, not {source.size}",
            )
        flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        self._buffer = (source.buffer_id, flat)
        return flat

    def _ipc_views(self, source: IpcSource) -> dict[str, torch.Tensor]:
        flat = self._map(source)
        views = {}
        for offset, (name, dtype, shape) in zip(source.offsets, source.specs, strict=True):
            count = torch.Size(shape).numel()
            views[name] = flat[offset : offset + count * dtype.itemsize].view(dtype).view(shape)
        return views

    # -- collective --------------------------------------------------------------------------------

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
            _sync(self.device)
        except (RuntimeError, OSError, ValueError) as error:
            self._group = None  # unusable now; the trainer forms a new group next time
            raise RequestError(
                "header.nccl", f"the transfer over weight group {source.group_name} failed: {error}"
            ) from error
        return buffers
