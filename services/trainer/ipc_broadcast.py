"""Weight broadcast through shared memory (`trainer.broadcast.transport = "ipc"`): replicas on
the trainer's node read the weights straight out of the trainer's memory.

The trainer keeps one staging buffer for the model's tensor list: on its GPU (exported as a
CUDA IPC handle), or on CPU in POSIX shared memory (torch.multiprocessing's file_system
strategy). Per update:

1. Copy the new weights into the buffer (on the device; one `_foreach_copy_`) and wait for
   the copy.
2. Send every replica an UpdateWeights stream holding only a header with
   `transport = WEIGHT_TRANSPORT_IPC` and `ipc = IpcBuffer{buffer_id, size, handle, offsets}`.
3. Each replica checks the header against its model, maps the buffer (once per buffer id),
   copies the tensors into its parameters between two decode steps, and answers.

The buffer is not written again until every replica of the update has answered or failed
(one update at a time). A replica that failed may still be reading it (its call timed out
while its engine copies), so after any failure the buffer is retired: the next update
stages into a new one under a new id, and the old memory is freed once nobody maps it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence

import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.model.weights import TORCH_TO_PB
from rlrun.trainer.broadcast import ReplicaChannels, ReplicaResult, retry_unavailable
from rlrun.v1 import inference_pb2_grpc, weights_pb2

log = logging.getLogger("rlrun.trainer.ipc_broadcast")

ALIGN_BYTES = 256
"""Each tensor starts at a multiple of this in the buffer (any dtype's alignment, and CUDA's
preferred one for copies)."""

Specs = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]


def _specs(tensors: dict[str, torch.Tensor]) -> Specs:
    return tuple((name, t.dtype, tuple(t.shape)) for name, t in tensors.items())


def _export(storage: torch.UntypedStorage, size: int) -> weights_pb2.IpcBuffer:
    """The handle another process opens `storage` with, field by field."""
    if storage.device.type == "cuda":
        device, handle, storage_size, storage_offset, ref_handle, ref_offset, event, sync = (
            storage._share_cuda_()
        )
        return weights_pb2.IpcBuffer(
            size_bytes=size,
            cuda=weights_pb2.CudaIpcHandle(
                device=device,
                handle=handle,
                storage_size_bytes=storage_size,
                storage_offset_bytes=storage_offset,
                ref_counter_handle=ref_handle,
                ref_counter_offset=ref_offset,
                event_handle=event,
                event_sync_required=sync,
            ),
        )
    manager, name, _ = storage._share_filename_cpu_()
    return weights_pb2.IpcBuffer(
        size_bytes=size,
        shared_memory=weights_pb2.SharedMemoryHandle(manager=manager.decode(), name=name.decode()),
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
        self.buffer = _export(storage, size)
        self.buffer.buffer_id = uuid.uuid4().hex
        self.buffer.offsets.extend(offsets)
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


def ipc_header(
    staging: StagingBuffer, version: int, rollback: bool = False
) -> weights_pb2.WeightUpdateHeader:
    return weights_pb2.WeightUpdateHeader(
        version=version,
        tensors=[
            weights_pb2.TensorSpec(name=name, dtype=TORCH_TO_PB[dtype], shape=list(shape))
            for name, dtype, shape in staging.specs
        ],
        total_bytes=sum(torch.Size(shape).numel() * dtype.itemsize for _, dtype, shape in staging.specs),
        transport=weights_pb2.WEIGHT_TRANSPORT_IPC,
        rollback=rollback,
        ipc=staging.buffer,
    )


class IpcWeightBroadcaster(ReplicaChannels):
    tensors_on_cpu = False
    """The tensors are staged where they are: on the trainer's GPU, or on CPU."""

    def __init__(self, addresses: list[str], config: BroadcastConfig, client: ClientOptions):
        super().__init__(addresses, config, client)
        self.staging: StagingBuffer | None = None
        self._lock = asyncio.Lock()
        """Held from staging until every replica answered: the buffer is not written meanwhile."""

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

    async def _send(
        self, address: str, header: weights_pb2.WeightUpdateHeader, started: float
    ) -> ReplicaResult:
        stub = inference_pb2_grpc.InferenceServiceStub(self.channels[address])

        async def attempt():
            message = weights_pb2.WeightUpdateMessage(header=header)
            return await stub.UpdateWeights(iter([message]), timeout=self.config.timeout_s)

        response, error = await retry_unavailable(address, attempt, self.config.retries)
        seconds = time.perf_counter() - started
        if response is None:
            log.error("weight update to %s failed: %s", address, error)
            return ReplicaResult(address=address, ok=False, error=error, seconds=seconds)
        return ReplicaResult(address=address, ok=True, seconds=seconds, bytes=header.total_bytes)

    async def broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        to: Sequence[str] | None = None,
        rollback: bool = False,
    ) -> list[ReplicaResult]:
        """Each result's seconds run from the start of staging to the replica's answer: the
        whole sync, so that bytes / seconds is its throughput."""
        targets = self.targets(to)
        if not targets:
            return []
        async with self._lock:
            started = time.perf_counter()
            staging = await asyncio.to_thread(self._stage, tensors)
            header = ipc_header(staging, version, rollback)
            results = list(await asyncio.gather(*(self._send(a, header, started) for a in targets)))
            if not all(r.ok for r in results):
                self.staging = None
        return results
