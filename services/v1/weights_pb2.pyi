from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    D_TYPE_UNSPECIFIED: _ClassVar[DType]
    D_TYPE_FLOAT32: _ClassVar[DType]
    D_TYPE_FLOAT16: _ClassVar[DType]
    D_TYPE_BFLOAT16: _ClassVar[DType]
    D_TYPE_FLOAT64: _ClassVar[DType]
    D_TYPE_INT64: _ClassVar[DType]
    D_TYPE_INT32: _ClassVar[DType]

class WeightTransport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_TRANSPORT_UNSPECIFIED: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_GRPC: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_NCCL: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_IPC: _ClassVar[WeightTransport]

class CollectiveBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTIVE_BACKEND_UNSPECIFIED: _ClassVar[CollectiveBackend]
    COLLECTIVE_BACKEND_PYNCCL: _ClassVar[CollectiveBackend]
    COLLECTIVE_BACKEND_TORCH_NCCL: _ClassVar[CollectiveBackend]
    COLLECTIVE_BACKEND_TORCH_GLOO: _ClassVar[CollectiveBackend]
D_TYPE_UNSPECIFIED: DType
D_TYPE_FLOAT32: DType
D_TYPE_FLOAT16: DType
D_TYPE_BFLOAT16: DType
D_TYPE_FLOAT64: DType
D_TYPE_INT64: DType
D_TYPE_INT32: DType
WEIGHT_TRANSPORT_UNSPECIFIED: WeightTransport
WEIGHT_TRANSPORT_GRPC: WeightTransport
WEIGHT_TRANSPORT_NCCL: WeightTransport
WEIGHT_TRANSPORT_IPC: WeightTransport
COLLECTIVE_BACKEND_UNSPECIFIED: CollectiveBackend
COLLECTIVE_BACKEND_PYNCCL: CollectiveBackend
COLLECTIVE_BACKEND_TORCH_NCCL: CollectiveBackend
COLLECTIVE_BACKEND_TORCH_GLOO: CollectiveBackend

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class NcclRendezvous(_message.Message):
    __slots__ = ("host", "port", "world_size", "rank", "group_name", "backend")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    world_size: int
    rank: int
    group_name: str
    backend: CollectiveBackend
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ..., group_name: _Optional[str] = ..., backend: _Optional[_Union[CollectiveBackend, str]] = ...) -> None: ...

class CudaIpcHandle(_message.Message):
    __slots__ = ("device", "handle", "storage_size_bytes", "storage_offset_bytes", "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    device: int
    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    def __init__(self, device: _Optional[int] = ..., handle: _Optional[bytes] = ..., storage_size_bytes: _Optional[int] = ..., storage_offset_bytes: _Optional[int] = ..., ref_counter_handle: _Optional[bytes] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ...) -> None: ...

class SharedMemoryHandle(_message.Message):
    __slots__ = ("manager", "name")
    MANAGER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    manager: str
    name: str
    def __init__(self, manager: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class IpcBuffer(_message.Message):
    __slots__ = ("buffer_id", "size_bytes", "cuda", "shared_memory", "offsets")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CUDA_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    size_bytes: int
    cuda: CudaIpcHandle
    shared_memory: SharedMemoryHandle
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, buffer_id: _Optional[str] = ..., size_bytes: _Optional[int] = ..., cuda: _Optional[_Union[CudaIpcHandle, _Mapping]] = ..., shared_memory: _Optional[_Union[SharedMemoryHandle, _Mapping]] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class WeightSyncInfo(_message.Message):
    __slots__ = ("node_id", "device", "transports", "backends")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    device: str
    transports: _containers.RepeatedScalarFieldContainer[WeightTransport]
    backends: _containers.RepeatedScalarFieldContainer[CollectiveBackend]
    def __init__(self, node_id: _Optional[str] = ..., device: _Optional[str] = ..., transports: _Optional[_Iterable[_Union[WeightTransport, str]]] = ..., backends: _Optional[_Iterable[_Union[CollectiveBackend, str]]] = ...) -> None: ...

class WeightUpdateHeader(_message.Message):
    __slots__ = ("version", "tensors", "total_bytes", "checksum", "transport", "nccl", "rollback", "ipc")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    NCCL_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    checksum: int
    transport: WeightTransport
    nccl: NcclRendezvous
    rollback: bool
    ipc: IpcBuffer
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., transport: _Optional[_Union[WeightTransport, str]] = ..., nccl: _Optional[_Union[NcclRendezvous, _Mapping]] = ..., rollback: _Optional[bool] = ..., ipc: _Optional[_Union[IpcBuffer, _Mapping]] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "index", "data")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    version: int
    index: int
    data: bytes
    def __init__(self, version: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WeightUpdateMessage(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: WeightUpdateHeader
    chunk: WeightChunk
    def __init__(self, header: _Optional[_Union[WeightUpdateHeader, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunk, _Mapping]] = ...) -> None: ...
