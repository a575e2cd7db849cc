"""rlrun/v1/plan.proto: the GenerationPlan (who plays each member, where its model is, how to
sample), validated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlrun.common.wire import WireError, enum_from_proto
from rlrun.common.wire.sampling import SamplingParams, sampling_from_proto, sampling_to_proto
from rlrun.v1 import plan_pb2

MemberRole = Literal["train", "fixed"]
EndpointKind = Literal["inference", "rule", "openai"]

_MEMBER_ROLE_TO_PB: dict[MemberRole, plan_pb2.MemberRole] = {
    "train": plan_pb2.MEMBER_ROLE_TRAIN,
    "fixed": plan_pb2.MEMBER_ROLE_FIXED,
}
_MEMBER_ROLE_FROM_PB: dict[int, MemberRole] = {v: k for k, v in _MEMBER_ROLE_TO_PB.items()}
_KIND_TO_PB: dict[EndpointKind, plan_pb2.EndpointKind] = {
    "inference": plan_pb2.ENDPOINT_KIND_INFERENCE,
    "rule": plan_pb2.ENDPOINT_KIND_RULE,
    "openai": plan_pb2.ENDPOINT_KIND_OPENAI,
}
_OPENAI_FIELDS = ("base_url", "model", "api_key_env", "max_concurrency", "max_retries", "timeout_s")
"""ModelEndpoint's fields of kind openai: the same names in the proto and in ModelEndpoint."""
_KIND_FROM_PB: dict[int, EndpointKind] = {v: k for k, v in _KIND_TO_PB.items()}


@dataclass
class ModelEndpoint:
    name: str
    kind: EndpointKind = "inference"
    addresses: list[str] = field(default_factory=list)
    base_url: str = ""
    """kind openai: the API's base URL (before `/chat/completions`)."""
    model: str = ""
    """kind openai: the model name the API is asked for."""
    api_key_env: str = ""
    """kind openai: the name of the env var holding the API key (never the key itself)."""
    max_concurrency: int = 0
    """kind openai: most calls in flight per env-server worker (0: 32)."""
    max_retries: int = 0
    """kind openai: retries of a 429, a 5xx or a connection error."""
    timeout_s: float = 0.0
    """kind openai: deadline of one call (0: 60 s)."""
    http_addresses: list[str] = field(default_factory=list)
    """kind inference: the replicas' HTTP base URLs (`http://host:port`), where known."""


@dataclass
class PlanTarget:
    member_id: str
    role: MemberRole
    model: ModelEndpoint
    sampling: SamplingParams


@dataclass
class TokenizerInfo:
    """A tokenizer's identity (rlrun.common.tokenizer_info computes it): empty fields are not
    declared."""

    name: str = ""
    sha256: str = ""
    vocab_size: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    """The chat format's end-of-message tokens."""

    def describe(self) -> str:
        return f"{self.name or '(unnamed)'} (sha256 {self.sha256[:12] or '-'}, vocab_size {self.vocab_size})"


@dataclass
class GenerationPlan:
    """Compiled once at the config boundary; keyed by member id ("policy" for single-agent)."""

    targets: dict[str, PlanTarget]
    tokenizer: TokenizerInfo = field(default_factory=TokenizerInfo)
    """The live policy's tokenizer and chat format, as its replicas report it."""
    text_addresses: list[str] = field(default_factory=list)
    """Replicas of the live policy for the text-level RPCs only (Tokenize, RenderChat, ...)."""

    def validate(self, where: str = "plan", *, check_sampling: bool = True) -> None:
        """`check_sampling=False`: the targets' sampling is validated already (as it came off
        the wire)."""
        if not self.targets:
            raise WireError(f"{where}.targets", f"{where}.targets is empty")
        for key, target in self.targets.items():
            at = f"{where}.targets[{key}]"
            if target.member_id != key:
                raise WireError(
                    f"{at}.member_id", f"{at}.member_id {target.member_id!r} differs from its key"
                )
            if target.model.kind == "inference" and not target.model.addresses:
                raise WireError(
                    f"{at}.model.addresses", f"{at}.model.addresses is empty for an inference target"
                )
            if target.model.kind == "openai":
                for name in ("base_url", "model"):
                    if not getattr(target.model, name):
                        raise WireError(
                            f"{at}.model.{name}", f"{at}.model.{name} is empty for an openai target"
                        )
            if check_sampling:
                target.sampling.validate(f"{at}.sampling")

    @property
    def is_multi_agent(self) -> bool:
        return len(self.targets) > 1 or next(iter(self.targets)) != "policy"


def tokenizer_info_to_proto(info: TokenizerInfo) -> plan_pb2.TokenizerInfo:
    return plan_pb2.TokenizerInfo(
        name=info.name, sha256=info.sha256, vocab_size=info.vocab_size, stop_token_ids=info.stop_token_ids
    )


def tokenizer_info_from_proto(msg: plan_pb2.TokenizerInfo) -> TokenizerInfo:
    return TokenizerInfo(msg.name, msg.sha256, msg.vocab_size, list(msg.stop_token_ids))


def endpoint_to_proto(endpoint: ModelEndpoint) -> plan_pb2.ModelEndpoint:
    return plan_pb2.ModelEndpoint(
        name=endpoint.name,
        kind=_KIND_TO_PB[endpoint.kind],
        addresses=endpoint.addresses,
        http_addresses=endpoint.http_addresses,
        **{name: getattr(endpoint, name) for name in _OPENAI_FIELDS},
    )


def endpoint_from_proto(msg: plan_pb2.ModelEndpoint, where: str = "model") -> ModelEndpoint:
    return ModelEndpoint(
        name=msg.name,
        kind=enum_from_proto(_KIND_FROM_PB, msg.kind, f"{where}.kind", "endpoint kind"),
        addresses=list(msg.addresses),
        http_addresses=list(msg.http_addresses),
        **{name: getattr(msg, name) for name in _OPENAI_FIELDS},
    )


def plan_to_proto(plan: GenerationPlan) -> plan_pb2.GenerationPlan:
    return plan_pb2.GenerationPlan(
        targets=[
            plan_pb2.PlanTarget(
                member_id=t.member_id,
                role=_MEMBER_ROLE_TO_PB[t.role],
                model=endpoint_to_proto(t.model),
                sampling=sampling_to_proto(t.sampling),
            )
            for t in plan.targets.values()
        ],
        tokenizer=tokenizer_info_to_proto(plan.tokenizer),
        text_addresses=plan.text_addresses,
    )


def plan_from_proto(
    msg: plan_pb2.GenerationPlan, where: str = "plan", *, vocab_size: int | None = None
) -> GenerationPlan:
    """`vocab_size`: the receiver's, which every target's stop tokens must lie in."""
    targets: dict[str, PlanTarget] = {}
    for i, t in enumerate(msg.targets):
        at = f"{where}.targets[{i}]"
        if t.member_id in targets:
            raise WireError(f"{at}.member_id", f"{at}.member_id {t.member_id!r} is not unique")
        targets[t.member_id] = PlanTarget(
            member_id=t.member_id,
            role=enum_from_proto(_MEMBER_ROLE_FROM_PB, t.role, f"{at}.role", "member role"),
            model=endpoint_from_proto(t.model, f"{at}.model"),
            sampling=sampling_from_proto(t.sampling, f"{at}.sampling", vocab_size=vocab_size),
        )
    plan = GenerationPlan(targets, tokenizer_info_from_proto(msg.tokenizer), list(msg.text_addresses))
    plan.validate(where, check_sampling=False)
    return plan
