from rlrun.v1 import training_pb2 as _training_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitBatchRequest(_message.Message):
    __slots__ = ("batch", "orchestrator_state")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ORCHESTRATOR_STATE_FIELD_NUMBER: _ClassVar[int]
    batch: _training_pb2.TrainingBatch
    orchestrator_state: bytes
    def __init__(self, batch: _Optional[_Union[_training_pb2.TrainingBatch, _Mapping]] = ..., orchestrator_state: _Optional[bytes] = ...) -> None: ...

class BroadcastResult(_message.Message):
    __slots__ = ("address", "ok", "error", "seconds", "bytes")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    address: str
    ok: bool
    error: str
    seconds: float
    bytes: int
    def __init__(self, address: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., seconds: _Optional[float] = ..., bytes: _Optional[int] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("step", "policy_version", "skipped", "skip_reason", "metrics", "broadcasts")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SKIP_REASON_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    BROADCASTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    skipped: bool
    skip_reason: str
    metrics: _containers.ScalarMap[str, float]
    broadcasts: _containers.RepeatedCompositeFieldContainer[BroadcastResult]
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., skipped: _Optional[bool] = ..., skip_reason: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., broadcasts: _Optional[_Iterable[_Union[BroadcastResult, _Mapping]]] = ...) -> None: ...

class GetTrainerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTrainerStatusResponse(_message.Message):
    __slots__ = ("step", "policy_version", "world_size", "last_checkpoint", "last_metrics", "resume_state")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    RESUME_STATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    world_size: int
    last_checkpoint: str
    last_metrics: _containers.ScalarMap[str, float]
    resume_state: bytes
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., world_size: _Optional[int] = ..., last_checkpoint: _Optional[str] = ..., last_metrics: _Optional[_Mapping[str, float]] = ..., resume_state: _Optional[bytes] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("extra_state", "step")
    EXTRA_STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    extra_state: bytes
    step: int
    def __init__(self, extra_state: _Optional[bytes] = ..., step: _Optional[int] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path", "step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("max_step",)
    MAX_STEP_FIELD_NUMBER: _ClassVar[int]
    max_step: int
    def __init__(self, max_step: _Optional[int] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("step", "policy_version", "checkpoint", "resume_state")
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RESUME_STATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    checkpoint: str
    resume_state: bytes
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., resume_state: _Optional[bytes] = ...) -> None: ...
