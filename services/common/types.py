"""In-process types of the wire contract, with their validation.

Proto messages live only at the service boundaries; inside, services use these
dataclasses. `rlrun.common.wire` converts between the two and calls the validators here,
whose errors name the offending field precisely (e.g. `branches[2].mask has 17 entries
but token_ids has 18`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rlrun.common.errors import RequestError

Role = Literal["system", "user", "assistant", "tool"]
LossKind = Literal["rl", "ce"]
StopCondition = Literal["", "completed", "length", "max_turns", "error", "cancelled"]
ExampleId = int | str

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
LOSS_KINDS: tuple[str, ...] = ("rl", "ce")


class WireError(RequestError):
    """A message that breaks the contract; `field` is the path of the offending field."""


def _finite(values, where: str) -> None:
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise WireError(f"{where}[{i}]", f"{where}[{i}] is {v}, not a finite number")


@dataclass
class SamplingParams:
    """The sampling settings of the proto's SamplingParams (rlrun/v1/sampling.proto): what
    training asks. The OpenAI-compatible API's own (min_p, logprobs, penalties, logit bias,
    structured outputs, ...) live in the inference service: `rlrun.inference.params`."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    n: int = 1

    def validate(
        self,
        where: str = "sampling",
        *,
        vocab_size: int | None = None,
        max_model_len: int | None = None,
        prompt_len: int | None = None,
        max_samples: int | None = None,
        samples_field: str = "n",
    ) -> None:
        """`max_samples`: the most samples one request may ask for (an engine whose queue
        holds at most that many could never take more, so retrying would not help);
        `samples_field`: the request's field that asked for them (OpenAI's `best_of` draws
        more samples than its `n`)."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise WireError(
                f"{where}.temperature",
                f"{where}.temperature must be a finite number >= 0, got {self.temperature}",
            )
        if not (0 < self.top_p <= 1):
            raise WireError(f"{where}.top_p", f"{where}.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise WireError(f"{where}.top_k", f"{where}.top_k must be >= 0, got {self.top_k}")
        if self.max_tokens <= 0:
            raise WireError(
                f"{where}.max_tokens", f"{where}.max_tokens must be positive, got {self.max_tokens}"
            )
        if self.n < 1:
            raise WireError(f"{where}.n", f"{where}.n must be >= 1, got {self.n}")
        if max_samples is not None and self.n > max_samples:
            raise WireError(
                f"{where}.{samples_field}",
                f"{where}.{samples_field} = {self.n} is more samples than this server can ever queue "
                f"({max_samples}, inference.max_waiting)",
            )
        if vocab_size is not None:
            for i, tok in enumerate(self.stop_token_ids):
                if not 0 <= tok < vocab_size:
                    raise WireError(
                        f"{where}.stop_token_ids[{i}]",
                        f"{where}.stop_token_ids[{i}] = {tok} is outside the vocabulary [0, {vocab_size})",
                    )
        if max_model_len is not None:
            budget = max_model_len - (prompt_len or 0)
            if self.max_tokens > budget:
                raise WireError(
                    f"{where}.max_tokens",
                    f"{where}.max_tokens = {self.max_tokens} exceeds the context: "
                    f"{prompt_len or 0} prompt tokens + max_tokens must be <= {max_model_len}",
                )


@dataclass
class Channel:
    loss: LossKind
    values: list[float]


@dataclass
class MessageNode:
    id: str
    role: Role
    token_ids: list[int]
    sampled_mask: list[bool]
    logprobs: list[float] = field(default_factory=list)
    """One entry per sampled token, in order."""
    parent: str | None = None
    content: str = ""
    is_observation: bool = False
    parse_error: bool = False

    @property
    def num_sampled(self) -> int:
        return sum(self.sampled_mask)


@dataclass
class Branch:
    node_ids: list[str]
    channels: list[Channel] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)


@dataclass
class TaskRef:
    env: str
    split: str
    idx: int
    example_id: ExampleId | None = None
    data: str = ""
    """JSON-encoded task data (filled by the env-server)."""


@dataclass
class RewardComponent:
    score: float
    weight: float = 1.0


@dataclass
class TraceError:
    type: str
    message: str
    retryable: bool = False


@dataclass
class Trace:
    id: str
    task: TaskRef
    nodes: list[MessageNode] = field(default_factory=list)
    branches: list[Branch] = field(default_factory=list)
    rollout_id: str = ""
    group_id: str = ""
    member_id: str = "policy"
    rewards: dict[str, RewardComponent] = field(default_factory=dict)
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[TraceError] = field(default_factory=list)
    stop_condition: StopCondition = ""
    is_truncated: bool = False
    policy_span: tuple[int, int] = (0, 0)
    timing: dict[str, float] = field(default_factory=dict)
    """setup_s, generation_s, scoring_s, total_s."""
    info: dict[str, str] = field(default_factory=dict)

    def node_map(self) -> dict[str, MessageNode]:
        return {node.id: node for node in self.nodes}

    def branch_length(self, index: int, nodes: dict[str, MessageNode] | None = None) -> int:
        nodes = nodes or self.node_map()
        return sum(len(nodes[nid].token_ids) for nid in self.branches[index].node_ids)

    def branch_tokens(self, index: int, nodes: dict[str, MessageNode] | None = None) -> BranchTokens:
        """The branch as flat per-token arrays (what the model saw, in order)."""
        nodes = nodes or self.node_map()
        out = BranchTokens([], [], [], [], [])
        for nid in self.branches[index].node_ids:
            node = nodes[nid]
            sampled = iter(node.logprobs)
            out.token_ids += node.token_ids
            out.sampled_mask += node.sampled_mask
            out.logprobs += [next(sampled) if s else 0.0 for s in node.sampled_mask]
            out.node_ids += [nid] * len(node.token_ids)
            out.observation += [node.is_observation] * len(node.token_ids)
        return out

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def validate(self, where: str = "trace") -> None:  # noqa: C901 - one flat check per rule of the trace contract, in the contract's order
        """Graph invariants, per-node lengths, finite numbers and branch dimensions."""
        if not self.id:
            raise WireError(f"{where}.id", f"{where}.id is empty")
        if not math.isfinite(self.reward):
            raise WireError(f"{where}.reward", f"{where}.reward is {self.reward}, not a finite number")
        for name, comp in self.rewards.items():
            if not (math.isfinite(comp.score) and math.isfinite(comp.weight)):
                raise WireError(
                    f"{where}.rewards[{name}]",
                    f"{where}.rewards[{name}] is not finite ({comp.score}, {comp.weight})",
                )
        for name, value in self.metrics.items():
            if not math.isfinite(value):
                raise WireError(
                    f"{where}.metrics[{name}]", f"{where}.metrics[{name}] is {value}, not a finite number"
                )
        if self.policy_span[0] > self.policy_span[1]:
            raise WireError(
                f"{where}.policy_span",
                f"{where}.policy_span start {self.policy_span[0]} > end {self.policy_span[1]}",
            )
        seen: dict[str, MessageNode] = {}
        for i, node in enumerate(self.nodes):
            at = f"{where}.nodes[{i}]"
            if not node.id:
                raise WireError(f"{at}.id", f"{at}.id is empty")
            if node.id in seen:
                raise WireError(f"{at}.id", f"{at}.id {node.id!r} is not unique")
            if node.parent and node.parent not in seen:
                raise WireError(f"{at}.parent", f"{at}.parent {node.parent!r} does not name an earlier node")
            if node.role not in ROLES:
                raise WireError(f"{at}.role", f"{at}.role {node.role!r} is not one of {ROLES}")
            if len(node.sampled_mask) != len(node.token_ids):
                raise WireError(
                    f"{at}.sampled_mask",
                    f"{at}.sampled_mask has {len(node.sampled_mask)} entries but token_ids has {len(node.token_ids)}",
                )
            if len(node.logprobs) != node.num_sampled:
                raise WireError(
                    f"{at}.logprobs",
                    f"{at}.logprobs has {len(node.logprobs)} entries but sampled_mask marks {node.num_sampled} sampled tokens",
                )
            _finite(node.logprobs, f"{at}.logprobs")
            for j, tok in enumerate(node.token_ids):
                if tok < 0:
                    raise WireError(f"{at}.token_ids[{j}]", f"{at}.token_ids[{j}] = {tok} is negative")
            seen[node.id] = node
        for b, branch in enumerate(self.branches):
            at = f"{where}.branches[{b}]"
            if not branch.node_ids:
                raise WireError(f"{at}.node_ids", f"{at}.node_ids is empty")
            parent = None
            for k, nid in enumerate(branch.node_ids):
                node = seen.get(nid)
                if node is None:
                    raise WireError(f"{at}.node_ids[{k}]", f"{at}.node_ids[{k}] {nid!r} names no node")
                if (node.parent or None) != parent:
                    raise WireError(
                        f"{at}.node_ids[{k}]",
                        f"{at}.node_ids[{k}] {nid!r} does not follow {parent!r} (its parent is {node.parent!r})",
                    )
                parent = nid
            length = sum(len(seen[nid].token_ids) for nid in branch.node_ids)
            validate_dims(at, length, branch.mask, branch.channels, length_name="token_ids")


@dataclass
class BranchTokens:
    token_ids: list[int]
    sampled_mask: list[bool]
    logprobs: list[float]
    node_ids: list[str]
    observation: list[bool]


def validate_dims(
    at: str, length: int, mask: list[bool], channels: list[Channel], *, length_name: str
) -> None:
    """A mask (if present) and every channel must have one entry per token."""
    if mask and len(mask) != length:
        raise WireError(f"{at}.mask", f"{at}.mask has {len(mask)} entries but {length_name} has {length}")
    for c, channel in enumerate(channels):
        if channel.loss not in LOSS_KINDS:
            raise WireError(
                f"{at}.channels[{c}].loss",
                f"{at}.channels[{c}].loss {channel.loss!r} is not one of {LOSS_KINDS}",
            )
        if len(channel.values) != length:
            raise WireError(
                f"{at}.channels[{c}].values",
                f"{at}.channels[{c}].values has {len(channel.values)} entries but {length_name} has {length}",
            )
        _finite(channel.values, f"{at}.channels[{c}].values")


@dataclass
class TrainingSample:
    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperatures: list[float]
    channels: list[Channel] = field(default_factory=list)

    def validate(self, where: str = "sample", vocab_size: int | None = None) -> None:
        n = len(self.token_ids)
        if n == 0:
            raise WireError(f"{where}.token_ids", f"{where}.token_ids is empty")
        if len(self.mask) != n:
            raise WireError(
                f"{where}.mask", f"{where}.mask has {len(self.mask)} entries but token_ids has {n}"
            )
        if len(self.logprobs) != n:
            raise WireError(
                f"{where}.logprobs",
                f"{where}.logprobs has {len(self.logprobs)} entries but token_ids has {n}",
            )
        if len(self.temperatures) != n:
            raise WireError(
                f"{where}.temperatures",
                f"{where}.temperatures has {len(self.temperatures)} entries but token_ids has {n}",
            )
        _finite(self.logprobs, f"{where}.logprobs")
        _finite(self.temperatures, f"{where}.temperatures")
        for i, t in enumerate(self.temperatures):
            if t <= 0:
                raise WireError(
                    f"{where}.temperatures[{i}]", f"{where}.temperatures[{i}] = {t} must be positive"
                )
        if vocab_size is not None:
            for i, tok in enumerate(self.token_ids):
                if not 0 <= tok < vocab_size:
                    raise WireError(
                        f"{where}.token_ids[{i}]",
                        f"{where}.token_ids[{i}] = {tok} is outside the vocabulary [0, {vocab_size})",
                    )
        validate_dims(where, n, self.mask, self.channels, length_name="token_ids")


@dataclass
class TrainingBatch:
    step: int
    policy_version: int
    samples: list[TrainingSample]
    metrics: dict[str, float] = field(default_factory=dict)
    learning_rate: float | None = None

    def validate(self, where: str = "batch", vocab_size: int | None = None) -> None:
        if not self.samples:
            raise WireError(f"{where}.samples", f"{where}.samples is empty")
        if self.learning_rate is not None and not (
            math.isfinite(self.learning_rate) and self.learning_rate > 0
        ):
            raise WireError(
                f"{where}.learning_rate",
                f"{where}.learning_rate must be a positive finite number, got {self.learning_rate}",
            )
        for i, sample in enumerate(self.samples):
            sample.validate(f"{where}.samples[{i}]", vocab_size)
        for name, value in self.metrics.items():
            if not math.isfinite(value):
                raise WireError(
                    f"{where}.metrics[{name}]", f"{where}.metrics[{name}] is {value}, not a finite number"
                )


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
