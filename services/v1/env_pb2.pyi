from rlrun.v1 import plan_pb2 as _plan_pb2
from rlrun.v1 import trace_pb2 as _trace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RewardRange(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class EnvInfo(_message.Message):
    __slots__ = ("env_id", "task_counts", "group_scoring", "algorithms", "members", "temperature", "tokenizer", "reward_range")
    class TaskCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SCORING_FIELD_NUMBER: _ClassVar[int]
    ALGORITHMS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    REWARD_RANGE_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    task_counts: _containers.ScalarMap[str, int]
    group_scoring: bool
    algorithms: _containers.RepeatedScalarFieldContainer[str]
    members: _containers.RepeatedScalarFieldContainer[str]
    temperature: float
    tokenizer: _plan_pb2.TokenizerInfo
    reward_range: RewardRange
    def __init__(self, env_id: _Optional[str] = ..., task_counts: _Optional[_Mapping[str, int]] = ..., group_scoring: _Optional[bool] = ..., algorithms: _Optional[_Iterable[str]] = ..., members: _Optional[_Iterable[str]] = ..., temperature: _Optional[float] = ..., tokenizer: _Optional[_Union[_plan_pb2.TokenizerInfo, _Mapping]] = ..., reward_range: _Optional[_Union[RewardRange, _Mapping]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("envs",)
    ENVS_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvInfo]
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvInfo, _Mapping]]] = ...) -> None: ...

class RunRolloutRequest(_message.Message):
    __slots__ = ("rollout_id", "group_id", "task", "plan")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    group_id: str
    task: _trace_pb2.TaskRef
    plan: _plan_pb2.GenerationPlan
    def __init__(self, rollout_id: _Optional[str] = ..., group_id: _Optional[str] = ..., task: _Optional[_Union[_trace_pb2.TaskRef, _Mapping]] = ..., plan: _Optional[_Union[_plan_pb2.GenerationPlan, _Mapping]] = ...) -> None: ...

class RunRolloutResponse(_message.Message):
    __slots__ = ("traces",)
    TRACES_FIELD_NUMBER: _ClassVar[int]
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    def __init__(self, traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ...) -> None: ...

class RunGroupRequest(_message.Message):
    __slots__ = ("group_id", "task", "plan", "n")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    task: _trace_pb2.TaskRef
    plan: _plan_pb2.GenerationPlan
    n: int
    def __init__(self, group_id: _Optional[str] = ..., task: _Optional[_Union[_trace_pb2.TaskRef, _Mapping]] = ..., plan: _Optional[_Union[_plan_pb2.GenerationPlan, _Mapping]] = ..., n: _Optional[int] = ...) -> None: ...

class RunGroupResponse(_message.Message):
    __slots__ = ("traces",)
    TRACES_FIELD_NUMBER: _ClassVar[int]
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    def __init__(self, traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ...) -> None: ...

class RunAlgorithmsRequest(_message.Message):
    __slots__ = ("env_id", "algorithms", "traces", "algorithm_args", "models")
    class AlgorithmArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    ALGORITHMS_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_ARGS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    algorithms: _containers.RepeatedScalarFieldContainer[str]
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    algorithm_args: _containers.ScalarMap[str, str]
    models: _containers.RepeatedCompositeFieldContainer[_plan_pb2.ModelEndpoint]
    def __init__(self, env_id: _Optional[str] = ..., algorithms: _Optional[_Iterable[str]] = ..., traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ..., algorithm_args: _Optional[_Mapping[str, str]] = ..., models: _Optional[_Iterable[_Union[_plan_pb2.ModelEndpoint, _Mapping]]] = ...) -> None: ...

class BranchResult(_message.Message):
    __slots__ = ("trace_id", "branch_index", "channels", "mask")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    branch_index: int
    channels: _containers.RepeatedCompositeFieldContainer[_trace_pb2.AdvantageChannel]
    mask: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, trace_id: _Optional[str] = ..., branch_index: _Optional[int] = ..., channels: _Optional[_Iterable[_Union[_trace_pb2.AdvantageChannel, _Mapping]]] = ..., mask: _Optional[_Iterable[bool]] = ...) -> None: ...

class RunAlgorithmsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BranchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BranchResult, _Mapping]]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("group_ids", "rollout_ids")
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    rollout_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ..., rollout_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...
