from rlrun.v1 import trace_pb2 as _trace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainingSample(_message.Message):
    __slots__ = ("token_ids", "mask", "logprobs", "temperatures", "channels")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURES_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    mask: _containers.RepeatedScalarFieldContainer[bool]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    temperatures: _containers.RepeatedScalarFieldContainer[float]
    channels: _containers.RepeatedCompositeFieldContainer[_trace_pb2.AdvantageChannel]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., mask: _Optional[_Iterable[bool]] = ..., logprobs: _Optional[_Iterable[float]] = ..., temperatures: _Optional[_Iterable[float]] = ..., channels: _Optional[_Iterable[_Union[_trace_pb2.AdvantageChannel, _Mapping]]] = ...) -> None: ...

class TrainingBatch(_message.Message):
    __slots__ = ("step", "policy_version", "samples", "metrics", "learning_rate")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    samples: _containers.RepeatedCompositeFieldContainer[TrainingSample]
    metrics: _containers.ScalarMap[str, float]
    learning_rate: float
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[TrainingSample, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., learning_rate: _Optional[float] = ...) -> None: ...
