from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_PHASE_UNSPECIFIED: _ClassVar[RunPhase]
    RUN_PHASE_PENDING: _ClassVar[RunPhase]
    RUN_PHASE_WARMUP: _ClassVar[RunPhase]
    RUN_PHASE_RUNNING: _ClassVar[RunPhase]
    RUN_PHASE_SUCCEEDED: _ClassVar[RunPhase]
    RUN_PHASE_FAILED: _ClassVar[RunPhase]
    RUN_PHASE_STOPPING: _ClassVar[RunPhase]
RUN_PHASE_UNSPECIFIED: RunPhase
RUN_PHASE_PENDING: RunPhase
RUN_PHASE_WARMUP: RunPhase
RUN_PHASE_RUNNING: RunPhase
RUN_PHASE_SUCCEEDED: RunPhase
RUN_PHASE_FAILED: RunPhase
RUN_PHASE_STOPPING: RunPhase

class GetRunStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunStatusResponse(_message.Message):
    __slots__ = ("phase", "step", "max_steps", "policy_version", "train_reward", "eval_reward", "off_policy_lag", "tokens_per_s", "last_error", "groups_dropped_stale", "metrics", "resumes", "eval_step", "eval_split", "groups_failed", "first_rollout_error")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAIN_REWARD_FIELD_NUMBER: _ClassVar[int]
    EVAL_REWARD_FIELD_NUMBER: _ClassVar[int]
    OFF_POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    GROUPS_DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    RESUMES_FIELD_NUMBER: _ClassVar[int]
    EVAL_STEP_FIELD_NUMBER: _ClassVar[int]
    EVAL_SPLIT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FAILED_FIELD_NUMBER: _ClassVar[int]
    FIRST_ROLLOUT_ERROR_FIELD_NUMBER: _ClassVar[int]
    phase: RunPhase
    step: int
    max_steps: int
    policy_version: int
    train_reward: float
    eval_reward: float
    off_policy_lag: int
    tokens_per_s: float
    last_error: str
    groups_dropped_stale: int
    metrics: _containers.ScalarMap[str, float]
    resumes: int
    eval_step: int
    eval_split: str
    groups_failed: int
    first_rollout_error: str
    def __init__(self, phase: _Optional[_Union[RunPhase, str]] = ..., step: _Optional[int] = ..., max_steps: _Optional[int] = ..., policy_version: _Optional[int] = ..., train_reward: _Optional[float] = ..., eval_reward: _Optional[float] = ..., off_policy_lag: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., last_error: _Optional[str] = ..., groups_dropped_stale: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., resumes: _Optional[int] = ..., eval_step: _Optional[int] = ..., eval_split: _Optional[str] = ..., groups_failed: _Optional[int] = ..., first_rollout_error: _Optional[str] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("phase",)
    PHASE_FIELD_NUMBER: _ClassVar[int]
    phase: RunPhase
    def __init__(self, phase: _Optional[_Union[RunPhase, str]] = ...) -> None: ...
