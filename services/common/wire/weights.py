"""rlrun/v1/weights.proto: a weight update's header and chunks, the handles of the fetched
transports, and what a replica tells the trainer about how it takes weights. Plain Python
(no torch): dtypes are named as torch names them (`float32`, `bfloat16`, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from rlrun.common.wire import WireError
from rlrun.v1 import weights_pb2

Transport = Literal["grpc", "nccl", "ipc"]
"""How the tensor bytes travel: in the stream (grpc), over a collective (nccl), or in the
trainer's staging buffer the replica maps (ipc)."""
Backend = Literal["pynccl", "nccl", "gloo"]
"""The process group of an nccl update: vLLM's communicator, torch NCCL, torch gloo."""

_DTYPE_TO_PB = {
    "float32": weights_pb2.D_TYPE_FLOAT32,
    "float16": weights_pb2.D_TYPE_FLOAT16,
    "bfloat16": weights_pb2.D_TYPE_BFLOAT16,
    "float64": weights_pb2.D_TYPE_FLOAT64,
    "int64": weights_pb2.D_TYPE_INT64,
    "int32": weights_pb2.D_TYPE_INT32,
}
_DTYPE_FROM_PB = {v: k for k, v in _DTYPE_TO_PB.items()}
DTYPES = tuple(_DTYPE_TO_PB)
_TRANSPORT_TO_PB: dict[Transport, weights_pb2.WeightTransport] = {
    "grpc": weights_pb2.WEIGHT_TRANSPORT_GRPC,
    "nccl": weights_pb2.WEIGHT_TRANSPORT_NCCL,
    "ipc": weights_pb2.WEIGHT_TRANSPORT_IPC,
}
_TRANSPORT_FROM_PB: dict[int, Transport] = {v: k for k, v in _TRANSPORT_TO_PB.items()}
_BACKEND_TO_PB: dict[Backend, weights_pb2.CollectiveBackend] = {
    "pynccl": weights_pb2.COLLECTIVE_BACKEND_PYNCCL,
    "nccl": weights_pb2.COLLECTIVE_BACKEND_TORCH_NCCL,
    "gloo": weights_pb2.COLLECTIVE_BACKEND_TORCH_GLOO,
}
# UNSPECIFIED is what trainers sent before the field existed: vLLM's communicator.
_BACKEND_FROM_PB = {
    **{v: k for k, v in _BACKEND_TO_PB.items()},
    weights_pb2.COLLECTIVE_BACKEND_UNSPECIFIED: "pynccl",
}


@dataclass
class TensorSpec:
    name: str
    dtype: str
    """As torch names it: `float32`, `bfloat16`, ... ("" for a dtype the wire does not know)."""
    shape: list[int]


@dataclass
class NcclRendezvous:
    host: str
    """Where the trainer (rank 0) hosts the group's rendezvous store."""
    port: int
    world_size: int
    rank: int
    """The receiving replica's (first) rank."""
    group_name: str
    backend: Backend


@dataclass
class CudaIpcHandle:
    """A CUDA allocation as torch.multiprocessing shares it (`UntypedStorage._share_cuda_`)."""

    device: int
    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool


@dataclass
class SharedMemoryHandle:
    """A CPU storage in POSIX shared memory (`UntypedStorage._share_filename_cpu_`)."""

    manager: str
    """Socket path of the exporter's torch_shm_manager."""
    name: str
    """The shared-memory object, `/torch_<pid>_<n>_<n>`."""


@dataclass
class IpcBuffer:
    buffer_id: str
    """One id is always the same memory: a replica maps it once."""
    size_bytes: int
    offsets: list[int]
    """Byte offset of each tensor, in the header's order."""
    cuda: CudaIpcHandle | None = None
    shared_memory: SharedMemoryHandle | None = None


@dataclass
class WeightUpdateHeader:
    version: int
    """The policy version these weights produce."""
    tensors: list[TensorSpec]
    """In stream order; their bytes are concatenated in this order."""
    total_bytes: int
    checksum: int = 0
    """xxh3_64 of the concatenated bytes (grpc only)."""
    transport: Transport | None = "grpc"
    """None: a transport the wire does not know (refused by the receiver)."""
    rollback: bool = False
    """The trainer went back to a checkpoint: `version` may be older than the served one."""
    nccl: NcclRendezvous | None = None
    ipc: IpcBuffer | None = None


@dataclass
class WeightChunk:
    version: int
    index: int
    data: bytes


@dataclass
class WeightSyncInfo:
    """What a replica tells the trainer for choosing a weight transport (GetStatus)."""

    node_id: str = ""
    """Equal for two processes that can map each other's memory."""
    device: str = ""
    """Where its parameters live: "cpu", "cuda:0", ..."""
    transports: list[Transport] = field(default_factory=list)
    backends: list[Backend] = field(default_factory=list)


def sync_info_to_proto(info: WeightSyncInfo) -> weights_pb2.WeightSyncInfo:
    return weights_pb2.WeightSyncInfo(
        node_id=info.node_id,
        device=info.device,
        transports=[_TRANSPORT_TO_PB[t] for t in info.transports],
        backends=[_BACKEND_TO_PB[b] for b in info.backends],
    )


def sync_info_from_proto(msg: weights_pb2.WeightSyncInfo) -> WeightSyncInfo:
    """Transports and backends this side does not know are left out (a newer replica may
    offer more): the trainer picks among the ones both know."""
    return WeightSyncInfo(
        node_id=msg.node_id,
        device=msg.device,
        transports=[_TRANSPORT_FROM_PB[t] for t in msg.transports if t in _TRANSPORT_FROM_PB],
        backends=[_BACKEND_FROM_PB[b] for b in msg.backends if b in _BACKEND_FROM_PB],
    )


def _ipc_to_proto(ipc: IpcBuffer) -> weights_pb2.IpcBuffer:
    msg = weights_pb2.IpcBuffer(buffer_id=ipc.buffer_id, size_bytes=ipc.size_bytes, offsets=ipc.offsets)
    if ipc.cuda is not None:
        c = ipc.cuda
        msg.cuda.CopyFrom(
            weights_pb2.CudaIpcHandle(
                device=c.device,
                handle=c.handle,
                storage_size_bytes=c.storage_size_bytes,
                storage_offset_bytes=c.storage_offset_bytes,
                ref_counter_handle=c.ref_counter_handle,
                ref_counter_offset=c.ref_counter_offset,
                event_handle=c.event_handle,
                event_sync_required=c.event_sync_required,
            )
        )
    elif ipc.shared_memory is not None:
        msg.shared_memory.CopyFrom(
            weights_pb2.SharedMemoryHandle(manager=ipc.shared_memory.manager, name=ipc.shared_memory.name)
        )
    return msg


def _ipc_from_proto(msg: weights_pb2.IpcBuffer) -> IpcBuffer:
    kind = msg.WhichOneof("handle")
    c, s = msg.cuda, msg.shared_memory
    return IpcBuffer(
        buffer_id=msg.buffer_id,
        size_bytes=msg.size_bytes,
        offsets=list(msg.offsets),
        cuda=CudaIpcHandle(
            c.device,
            c.handle,
            c.storage_size_bytes,
            c.storage_offset_bytes,
            c.ref_counter_handle,
            c.ref_counter_offset,
            c.event_handle,
            c.event_sync_required,
        )
        if kind == "cuda"
        else None,
        shared_memory=SharedMemoryHandle(s.manager, s.name) if kind == "shared_memory" else None,
    )


def header_to_proto(header: WeightUpdateHeader) -> weights_pb2.WeightUpdateHeader:
    if header.transport is None:
        raise ValueError("a header to send names its transport")
    msg = weights_pb2.WeightUpdateHeader(
        version=header.version,
        tensors=[
            weights_pb2.TensorSpec(name=t.name, dtype=_DTYPE_TO_PB[t.dtype], shape=t.shape)
            for t in header.tensors
        ],
        total_bytes=header.total_bytes,
        checksum=header.checksum,
        transport=_TRANSPORT_TO_PB[header.transport],
        rollback=header.rollback,
    )
    if header.nccl is not None:
        n = header.nccl
        msg.nccl.CopyFrom(
            weights_pb2.NcclRendezvous(
                host=n.host,
                port=n.port,
                world_size=n.world_size,
                rank=n.rank,
                group_name=n.group_name,
                backend=_BACKEND_TO_PB[n.backend],
            )
        )
    if header.ipc is not None:
        msg.ipc.CopyFrom(_ipc_to_proto(header.ipc))
    return msg


def header_from_proto(msg: weights_pb2.WeightUpdateHeader) -> WeightUpdateHeader:
    """Structure only: the receiver checks the header against its model (and a transport it
    does not take) itself."""
    if msg.version < 0:
        raise WireError("header.version", f"header.version must be >= 0, got {msg.version}")
    n = msg.nccl
    backend = _BACKEND_FROM_PB.get(n.backend)
    if msg.HasField("nccl") and backend is None:
        raise WireError("header.nccl.backend", f"header.nccl.backend {n.backend} is not a known backend")
    return WeightUpdateHeader(
        version=msg.version,
        tensors=[TensorSpec(t.name, _DTYPE_FROM_PB.get(t.dtype, ""), list(t.shape)) for t in msg.tensors],
        total_bytes=msg.total_bytes,
        checksum=msg.checksum,
        transport=_TRANSPORT_FROM_PB.get(msg.transport),
        rollback=msg.rollback,
        nccl=NcclRendezvous(n.host, n.port, n.world_size, n.rank, n.group_name, backend)
        if msg.HasField("nccl") and backend is not None
        else None,
        ipc=_ipc_from_proto(msg.ipc) if msg.HasField("ipc") else None,
    )


WeightUpdateStream = Iterator[weights_pb2.WeightUpdateMessage]
"""An UpdateWeights client stream, as it goes out."""


def update_messages(
    header: WeightUpdateHeader, chunks: Iterator[WeightChunk] = iter(())
) -> WeightUpdateStream:
    """The UpdateWeights client stream: the header, then the chunks (none for a fetched
    transport), each built as the stream goes out."""
    yield weights_pb2.WeightUpdateMessage(header=header_to_proto(header))
    for chunk in chunks:
        yield weights_pb2.WeightUpdateMessage(
            chunk=weights_pb2.WeightChunk(version=chunk.version, index=chunk.index, data=chunk.data)
        )


def update_message_from_proto(
    msg: weights_pb2.WeightUpdateMessage,
) -> WeightUpdateHeader | WeightChunk | None:
    """A stream message: its header, its chunk (its data read once: every read of a bytes
    field copies it), or None when it carries neither."""
    kind = msg.WhichOneof("payload")
    if kind == "header":
        return header_from_proto(msg.header)
    if kind == "chunk":
        chunk = msg.chunk
        return WeightChunk(chunk.version, chunk.index, chunk.data)
    return None
