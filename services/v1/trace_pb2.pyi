from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class StopCondition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_CONDITION_UNSPECIFIED: _ClassVar[StopCondition]
    STOP_CONDITION_COMPLETED: _ClassVar[StopCondition]
    STOP_CONDITION_LENGTH: _ClassVar[StopCondition]
    STOP_CONDITION_MAX_TURNS: _ClassVar[StopCondition]
    STOP_CONDITION_ERROR: _ClassVar[StopCondition]
    STOP_CONDITION_CANCELLED: _ClassVar[StopCondition]

class LossType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOSS_TYPE_UNSPECIFIED: _ClassVar[LossType]
    LOSS_TYPE_RL: _ClassVar[LossType]
    LOSS_TYPE_CE: _ClassVar[LossType]
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
STOP_CONDITION_UNSPECIFIED: StopCondition
STOP_CONDITION_COMPLETED: StopCondition
STOP_CONDITION_LENGTH: StopCondition
STOP_CONDITION_MAX_TURNS: StopCondition
STOP_CONDITION_ERROR: StopCondition
STOP_CONDITION_CANCELLED: StopCondition
LOSS_TYPE_UNSPECIFIED: LossType
LOSS_TYPE_RL: LossType
LOSS_TYPE_CE: LossType

class MessageNode(_message.Message):
    __slots__ = ("id", "parent", "role", "content", "token_ids", "sampled_mask", "logprobs", "is_observation", "parse_error")
    ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_MASK_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    IS_OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    PARSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    parent: str
    role: Role
    content: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampled_mask: _containers.RepeatedScalarFieldContainer[bool]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    is_observation: bool
    parse_error: bool
    def __init__(self, id: _Optional[str] = ..., parent: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampled_mask: _Optional[_Iterable[bool]] = ..., logprobs: _Optional[_Iterable[float]] = ..., is_observation: _Optional[bool] = ..., parse_error: _Optional[bool] = ...) -> None: ...

class AdvantageChannel(_message.Message):
    __slots__ = ("loss", "values")
    LOSS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    loss: LossType
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, loss: _Optional[_Union[LossType, str]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class Branch(_message.Message):
    __slots__ = ("node_ids", "channels", "mask")
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    channels: _containers.RepeatedCompositeFieldContainer[AdvantageChannel]
    mask: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, node_ids: _Optional[_Iterable[str]] = ..., channels: _Optional[_Iterable[_Union[AdvantageChannel, _Mapping]]] = ..., mask: _Optional[_Iterable[bool]] = ...) -> None: ...

class ExampleId(_message.Message):
    __slots__ = ("int_value", "str_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STR_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    str_value: str
    def __init__(self, int_value: _Optional[int] = ..., str_value: _Optional[str] = ...) -> None: ...

class TaskRef(_message.Message):
    __slots__ = ("env", "split", "idx", "example_id", "data")
    ENV_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    IDX_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    env: str
    split: str
    idx: int
    example_id: ExampleId
    data: str
    def __init__(self, env: _Optional[str] = ..., split: _Optional[str] = ..., idx: _Optional[int] = ..., example_id: _Optional[_Union[ExampleId, _Mapping]] = ..., data: _Optional[str] = ...) -> None: ...

class RewardComponent(_message.Message):
    __slots__ = ("score", "weight")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    score: float
    weight: float
    def __init__(self, score: _Optional[float] = ..., weight: _Optional[float] = ...) -> None: ...

class TraceError(_message.Message):
    __slots__ = ("type", "message", "retryable")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    retryable: bool
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...

class PolicySpan(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("generation_s", "scoring_s", "total_s", "setup_s")
    GENERATION_S_FIELD_NUMBER: _ClassVar[int]
    SCORING_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    SETUP_S_FIELD_NUMBER: _ClassVar[int]
    generation_s: float
    scoring_s: float
    total_s: float
    setup_s: float
    def __init__(self, generation_s: _Optional[float] = ..., scoring_s: _Optional[float] = ..., total_s: _Optional[float] = ..., setup_s: _Optional[float] = ...) -> None: ...

class Trace(_message.Message):
    __slots__ = ("id", "rollout_id", "group_id", "task", "member_id", "nodes", "branches", "rewards", "reward", "metrics", "errors", "stop_condition", "is_truncated", "policy_span", "timing", "info")
    class RewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: RewardComponent
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[RewardComponent, _Mapping]] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    STOP_CONDITION_FIELD_NUMBER: _ClassVar[int]
    IS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    POLICY_SPAN_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    id: str
    rollout_id: str
    group_id: str
    task: TaskRef
    member_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[MessageNode]
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    rewards: _containers.MessageMap[str, RewardComponent]
    reward: float
    metrics: _containers.ScalarMap[str, float]
    errors: _containers.RepeatedCompositeFieldContainer[TraceError]
    stop_condition: StopCondition
    is_truncated: bool
    policy_span: PolicySpan
    timing: Timing
    info: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., rollout_id: _Optional[str] = ..., group_id: _Optional[str] = ..., task: _Optional[_Union[TaskRef, _Mapping]] = ..., member_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[MessageNode, _Mapping]]] = ..., branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ..., rewards: _Optional[_Mapping[str, RewardComponent]] = ..., reward: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ..., errors: _Optional[_Iterable[_Union[TraceError, _Mapping]]] = ..., stop_condition: _Optional[_Union[StopCondition, str]] = ..., is_truncated: _Optional[bool] = ..., policy_span: _Optional[_Union[PolicySpan, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...
