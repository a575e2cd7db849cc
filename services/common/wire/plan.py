"""rlrun/v1/plan.proto: the GenerationPlan (who plays each member, where its model is, how to
sample), validated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlrun.common.wire import WireError, enum_from_proto
from rlrun.common.wire.sampling import SamplingParams, sampling_from_proto, sampling_to_proto
from rlrun.v1 import plan_pb2

_MEMBER_ROLE_TO_PB = {"train": plan_pb2.MEMBER_ROLE_TRAIN, "fixed": plan_pb2.MEMBER_ROLE_FIXED}
_MEMBER_ROLE_FROM_PB = {v: k for k, v in _MEMBER_ROLE_TO_PB.items()}
_KIND_TO_PB = {
    "inference": plan_pb2.ENDPOINT_KIND_INFERENCE,
    "rule": plan_pb2.ENDPOINT_KIND_RULE,
    "openai": plan_pb2.ENDPOINT_KIND_OPENAI,
}
_OPENAI_FIELDS = ("base_url", "model", "api_key_env", "max_concurrency", "max_retries", "timeout_s")
"""ModelEndpoint's fields of kind openai: the same names in the proto and in ModelEndpoint."""
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}


MemberRole = Literal["train", "fixed"]
EndpointKind = Literal["inference", "rule", "openai"]


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
class GenerationPlan:
    """Compiled once at the config boundary; keyed by member id ("policy" for single-agent)."""

    targets: dict[str, PlanTarget]

    def validate(self, where: str = "plan") -> None:
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
            target.sampling.validate(f"{at}.sampling")

    @property
    def is_multi_agent(self) -> bool:
        return len(self.targets) > 1 or next(iter(self.targets)) != "policy"


def plan_to_proto(plan: GenerationPlan) -> plan_pb2.GenerationPlan:
    return plan_pb2.GenerationPlan(
        targets=[
            plan_pb2.PlanTarget(
                member_id=t.member_id,
                role=_MEMBER_ROLE_TO_PB[t.role],
                model=plan_pb2.ModelEndpoint(
                    name=t.model.name,
                    kind=_KIND_TO_PB[t.model.kind],
                    addresses=t.model.addresses,
                    http_addresses=t.model.http_addresses,
                    **{name: getattr(t.model, name) for name in _OPENAI_FIELDS},
                ),
                sampling=sampling_to_proto(t.sampling),
            )
            for t in plan.targets.values()
        ]
    )


def plan_from_proto(msg: plan_pb2.GenerationPlan, where: str = "plan") -> GenerationPlan:
    targets: dict[str, PlanTarget] = {}
    for i, t in enumerate(msg.targets):
        at = f"{where}.targets[{i}]"
        if t.member_id in targets:
            raise WireError(f"{at}.member_id", f"{at}.member_id {t.member_id!r} is not unique")
        targets[t.member_id] = PlanTarget(
            member_id=t.member_id,
            role=enum_from_proto(_MEMBER_ROLE_FROM_PB, t.role, f"{at}.role", "member role"),
            model=ModelEndpoint(
                name=t.model.name,
                kind=enum_from_proto(_KIND_FROM_PB, t.model.kind, f"{at}.model.kind", "endpoint kind"),
                addresses=list(t.model.addresses),
                http_addresses=list(t.model.http_addresses),
                **{name: getattr(t.model, name) for name in _OPENAI_FIELDS},
            ),
            sampling=sampling_from_proto(t.sampling, f"{at}.sampling"),
        )
    plan = GenerationPlan(targets)
    plan.validate(where)
    return plan
