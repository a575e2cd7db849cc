from rlrun.v1 import sampling_pb2 as _sampling_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_ROLE_UNSPECIFIED: _ClassVar[MemberRole]
    MEMBER_ROLE_TRAIN: _ClassVar[MemberRole]
    MEMBER_ROLE_FIXED: _ClassVar[MemberRole]

class EndpointKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENDPOINT_KIND_UNSPECIFIED: _ClassVar[EndpointKind]
    ENDPOINT_KIND_INFERENCE: _ClassVar[EndpointKind]
    ENDPOINT_KIND_RULE: _ClassVar[EndpointKind]
    ENDPOINT_KIND_OPENAI: _ClassVar[EndpointKind]
MEMBER_ROLE_UNSPECIFIED: MemberRole
MEMBER_ROLE_TRAIN: MemberRole
MEMBER_ROLE_FIXED: MemberRole
ENDPOINT_KIND_UNSPECIFIED: EndpointKind
ENDPOINT_KIND_INFERENCE: EndpointKind
ENDPOINT_KIND_RULE: EndpointKind
ENDPOINT_KIND_OPENAI: EndpointKind

class ModelEndpoint(_message.Message):
    __slots__ = ("name", "kind", "addresses", "base_url", "model", "api_key_env", "max_concurrency", "max_retries", "timeout_s", "http_addresses")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_ENV_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: EndpointKind
    addresses: _containers.RepeatedScalarFieldContainer[str]
    base_url: str
    model: str
    api_key_env: str
    max_concurrency: int
    max_retries: int
    timeout_s: float
    http_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[EndpointKind, str]] = ..., addresses: _Optional[_Iterable[str]] = ..., base_url: _Optional[str] = ..., model: _Optional[str] = ..., api_key_env: _Optional[str] = ..., max_concurrency: _Optional[int] = ..., max_retries: _Optional[int] = ..., timeout_s: _Optional[float] = ..., http_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class PlanTarget(_message.Message):
    __slots__ = ("member_id", "role", "model", "sampling")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    role: MemberRole
    model: ModelEndpoint
    sampling: _sampling_pb2.SamplingParams
    def __init__(self, member_id: _Optional[str] = ..., role: _Optional[_Union[MemberRole, str]] = ..., model: _Optional[_Union[ModelEndpoint, _Mapping]] = ..., sampling: _Optional[_Union[_sampling_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("name", "sha256", "vocab_size", "stop_token_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    sha256: str
    vocab_size: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., sha256: _Optional[str] = ..., vocab_size: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerationPlan(_message.Message):
    __slots__ = ("targets", "tokenizer", "text_addresses")
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    TEXT_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[PlanTarget]
    tokenizer: TokenizerInfo
    text_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, targets: _Optional[_Iterable[_Union[PlanTarget, _Mapping]]] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., text_addresses: _Optional[_Iterable[str]] = ...) -> None: ...
