"""The ipc transport (`trainer.broadcast.transport = "ipc"`): replicas on the trainer's node read
the weights straight out of the trainer's memory. Both halves.

Sending (`IpcWeightBroadcaster`): the trainer keeps one staging buffer for the model's tensor list, on
its GPU (exported as a CUDA IPC handle) or on CPU in POSIX shared memory
(torch.multiprocessing's file_system strategy). Per update:

1. Copy the new weights into the buffer (on the device; one `_foreach_copy_`) and wait for
   the copy.
2. Send every replica an UpdateWeights stream holding only a header with `transport = ipc`
   and `ipc = IpcBuffer{buffer_id, size, handle, offsets}`.
3. Each replica checks the header against its model (`ipc_source`), maps the buffer (once per
   buffer id, `IpcReceiver`), copies the tensors into its parameters between two decode
   steps, and answers.

The buffer is not written again until every replica of the update has answered or failed
(one update at a time). A replica that failed may still be reading it (its call timed out
while its engine copies), so after any failure the buffer is retired: the next update stages
into a new one under a new id, and the old memory is freed once nobody maps it.

Receiving: the front end checks the header (`ipc_source`: every name, dtype, shape, offset
and size before anything is opened) and hands a plain, picklable `IpcSource` to the process
where the parameters live. Handles are never unpickled from the wire: each field has its own
proto field, and only a storage is rebuilt from them. A source that cannot be opened raises
`RequestError` before any parameter is written, so a failed update changes nothing.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass

import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.errors import RequestError
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.weights.protocol import (
    Opened,
    Specs,
    TensorLayout,
    Update,
    WeightSender,
    WeightSource,
    dtype_name,
)
from rlrun.common.wire.weights import (
    CudaIpcHandle,
    IpcBuffer,
    SharedMemoryHandle,
    TensorSpec,
    WeightUpdateHeader,
)

log = logging.getLogger("rlrun.trainer.ipc_broadcast")

ALIGN_BYTES = 256
"""Each tensor starts at a multiple of this in the buffer (any dtype's alignment, and CUDA's
preferred one for copies)."""

CUDA_IPC_EVENT_HANDLE_BYTES = 64
"""sizeof(cudaIpcEventHandle_t)."""

MAX_CUDA_HANDLE_BYTES = 4096
"""An allocation's handle is torch's versioned encoding (a cudaIpcMemHandle_t, or an
expandable segment's handles); torch parses it, this only bounds it."""

_SHM_NAME = re.compile(r"/torch_\d+_\d+_\d+")
"""The shared-memory objects torch's file_system strategy creates (and nothing else)."""


# ---- the sending half -----------------------------------------------------------------------


def _specs(tensors: dict[str, torch.Tensor]) -> Specs:
    return tuple((name, t.dtype, tuple(t.shape)) for name, t in tensors.items())


def _export(storage: torch.UntypedStorage, size: int, buffer_id: str, offsets: list[int]) -> IpcBuffer:
    """The handle another process opens `storage` with, field by field."""
    if storage.device.type == "cuda":
        device, handle, storage_size, storage_offset, ref_handle, ref_offset, event, sync = (
            storage._share_cuda_()
        )
        cuda = CudaIpcHandle(
            device, handle, storage_size, storage_offset, ref_handle, ref_offset, event, sync
        )
        return IpcBuffer(buffer_id, size, offsets, cuda=cuda)
    manager, name, _ = storage._share_filename_cpu_()
    return IpcBuffer(
        buffer_id, size, offsets, shared_memory=SharedMemoryHandle(manager.decode(), name.decode())
    )


class StagingBuffer:
    """The model's tensors laid out in one shareable allocation on `device`, exported once."""

    def __init__(self, specs: Specs, device: torch.device):
        self.specs = specs
        self.device = device
        offsets, size = [], 0
        for _, dtype, shape in specs:
            offsets.append(size)
            size += -(-torch.Size(shape).numel() * dtype.itemsize // ALIGN_BYTES) * ALIGN_BYTES
        self.size = size
        if device.type == "cuda":
            flat = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
            storage = flat.untyped_storage()
        else:
            # Moved into shared memory by the export below: the tensor is built after it.
            storage = torch.UntypedStorage(max(size, 1))
        self.buffer = _export(storage, size, uuid.uuid4().hex, offsets)
        flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        self.views = {
            name: flat[offset : offset + torch.Size(shape).numel() * dtype.itemsize].view(dtype).view(shape)
            for offset, (name, dtype, shape) in zip(offsets, specs, strict=True)
        }

    def stage(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copies `tensors` in and waits for the copy: a replica reads them from another process."""
        names = list(tensors)
        with torch.no_grad():
            torch._foreach_copy_([self.views[n] for n in names], [tensors[n] for n in names])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def ipc_header(staging: StagingBuffer, version: int, rollback: bool = False) -> WeightUpdateHeader:
    return WeightUpdateHeader(
        version=version,
        tensors=[TensorSpec(name, dtype_name(dtype), list(shape)) for name, dtype, shape in staging.specs],
        total_bytes=sum(torch.Size(shape).numel() * dtype.itemsize for _, dtype, shape in staging.specs),
        transport="ipc",
        rollback=rollback,
        ipc=copy.deepcopy(staging.buffer),  # each header its own: a receiver may hold it
    )


@dataclass
class IpcUpdate(Update):
    header: WeightUpdateHeader | None = None


class IpcWeightBroadcaster(WeightSender):
    transport = "ipc"
    tensors_on_cpu = False
    """The tensors are staged where they are: on the trainer's GPU, or on CPU."""

    one_at_a_time = True
    """From staging until every replica answered: the buffer is not written meanwhile."""

    def __init__(self, addresses: list[str], config: BroadcastConfig, client: ClientOptions):
        super().__init__(addresses, config, client)
        self.staging: StagingBuffer | None = None

    def _stage(self, tensors: dict[str, torch.Tensor]) -> StagingBuffer:
        specs = _specs(tensors)
        device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
        if self.staging is None or self.staging.specs != specs or self.staging.device != device:
            self.staging = StagingBuffer(specs, device)
            log.info(
                "weight staging buffer %s: %d bytes on %s",
                self.staging.buffer.buffer_id,
                self.staging.size,
                device,
            )
        self.staging.stage(tensors)
        return self.staging

    async def prepare(self, tensors, version, rollback, targets) -> IpcUpdate:
        """Each replica's seconds run from the start of staging to its answer: the whole sync,
        so that bytes / seconds is its throughput."""
        started = time.perf_counter()
        header = ipc_header(await asyncio.to_thread(self._stage, tensors), version, rollback)
        return IpcUpdate(version, header.total_bytes, started=started, header=header)

    async def send(self, address: str, update: Update) -> None:
        assert isinstance(update, IpcUpdate) and update.header is not None
        await self.update_weights(address, update.header)

    def discard(self, update: Update) -> None:
        self.staging = None


# ---- the receiving half ---------------------------------------------------------------------


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


def _check_offsets(ipc: IpcBuffer, layout: TensorLayout) -> None:
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


def _cuda_handle(handle: CudaIpcHandle) -> tuple:
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


def _shared_memory_handle(handle: SharedMemoryHandle) -> tuple[bytes, bytes]:
    if not _SHM_NAME.fullmatch(handle.name):
        raise RequestError(
            "header.ipc.shared_memory.name", f"{handle.name!r} is not a torch shared-memory object name"
        )
    if not os.path.isabs(handle.manager) or "\0" in handle.manager:
        raise RequestError("header.ipc.shared_memory.manager", "must be the absolute path of a socket")
    return handle.manager.encode(), handle.name.encode()


def ipc_source(header: WeightUpdateHeader, expected: dict[str, torch.Tensor]) -> IpcSource:
    """The checked source of an IPC update against the model's tensors `expected`."""
    ipc = header.ipc
    if ipc is None:
        raise RequestError("header.ipc", "an IPC update needs header.ipc (the staging buffer)")
    layout = TensorLayout(header.tensors, expected)
    layout.check_total(header)
    if not ipc.buffer_id:
        raise RequestError("header.ipc.buffer_id", "header.ipc.buffer_id must be set")
    _check_offsets(ipc, layout)
    if ipc.cuda is None and ipc.shared_memory is None:
        raise RequestError("header.ipc", "header.ipc needs a cuda or shared_memory handle")
    return IpcSource(
        buffer_id=ipc.buffer_id,
        size=ipc.size_bytes,
        offsets=tuple(ipc.offsets),
        specs=layout.specs,
        cuda=_cuda_handle(ipc.cuda) if ipc.cuda is not None else None,
        shared_memory=_shared_memory_handle(ipc.shared_memory) if ipc.shared_memory is not None else None,
    )


class IpcReceiver:
    """Lives in the process that holds the parameters (on `device`): maps the trainer's
    staging buffer, and keeps it mapped for the next update."""

    def __init__(self, device: torch.device):
        self.device = device
        self._buffer: tuple[str, torch.Tensor] | None = None
        """(buffer id, the mapped staging buffer as bytes)."""

    def source(self, source: IpcSource) -> WeightSource:
        # Copy from the trainer's memory, then wait for the copy: its device and ours.
        return Opened(lambda: self._views(source), (self._device_of(source), self.device))

    def _device_of(self, source: IpcSource) -> torch.device:
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

    def _views(self, source: IpcSource) -> dict[str, torch.Tensor]:
        flat = self._map(source)
        views = {}
        for offset, (name, dtype, shape) in zip(source.offsets, source.specs, strict=True):
            count = torch.Size(shape).numel()
            views[name] = flat[offset : offset + count * dtype.itemsize].view(dtype).view(shape)
        return views
