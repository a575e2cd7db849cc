"""rlrun/v1/trace.proto: the Trace (one member's rollout as a message graph) and its parts,
with their validation, whose errors name the offending field precisely (e.g.
`branches[2].mask has 17 entries but token_ids has 18`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from google.protobuf import json_format

from rlrun.common.wire import WireError, enum_from_proto
from rlrun.v1 import trace_pb2

Role = Literal["system", "user", "assistant", "tool"]
LossKind = Literal["rl", "ce"]
StopCondition = Literal["", "completed", "length", "max_turns", "error", "cancelled"]
ExampleId = int | str

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
LOSS_KINDS: tuple[str, ...] = ("rl", "ce")


def finite(values, where: str) -> None:
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise WireError(f"{where}[{i}]", f"{where}[{i}] is {v}, not a finite number")


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
            finite(node.logprobs, f"{at}.logprobs")
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
                named = seen.get(nid)
                if named is None:
                    raise WireError(f"{at}.node_ids[{k}]", f"{at}.node_ids[{k}] {nid!r} names no node")
                if (named.parent or None) != parent:
                    raise WireError(
                        f"{at}.node_ids[{k}]",
                        f"{at}.node_ids[{k}] {nid!r} does not follow {parent!r} (its parent is {named.parent!r})",
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
        finite(channel.values, f"{at}.channels[{c}].values")


_ROLE_TO_PB: dict[Role, trace_pb2.Role] = {
    "system": trace_pb2.ROLE_SYSTEM,
    "user": trace_pb2.ROLE_USER,
    "assistant": trace_pb2.ROLE_ASSISTANT,
    "tool": trace_pb2.ROLE_TOOL,
}
_ROLE_FROM_PB: dict[int, Role] = {v: k for k, v in _ROLE_TO_PB.items()}
_LOSS_TO_PB: dict[LossKind, trace_pb2.LossType] = {
    "rl": trace_pb2.LOSS_TYPE_RL,
    "ce": trace_pb2.LOSS_TYPE_CE,
}
_LOSS_FROM_PB: dict[int, LossKind] = {v: k for k, v in _LOSS_TO_PB.items()}
STOP_TO_PB: dict[StopCondition, trace_pb2.StopCondition] = {
    "": trace_pb2.STOP_CONDITION_UNSPECIFIED,
    "completed": trace_pb2.STOP_CONDITION_COMPLETED,
    "length": trace_pb2.STOP_CONDITION_LENGTH,
    "max_turns": trace_pb2.STOP_CONDITION_MAX_TURNS,
    "error": trace_pb2.STOP_CONDITION_ERROR,
    "cancelled": trace_pb2.STOP_CONDITION_CANCELLED,
}
STOP_FROM_PB: dict[int, StopCondition] = {v: k for k, v in STOP_TO_PB.items()}


def channels_to_proto(channels: list[Channel]) -> list[trace_pb2.AdvantageChannel]:
    return [trace_pb2.AdvantageChannel(loss=_LOSS_TO_PB[c.loss], values=c.values) for c in channels]


def channels_from_proto(channels, where: str) -> list[Channel]:
    return [
        Channel(
            loss=enum_from_proto(_LOSS_FROM_PB, c.loss, f"{where}.channels[{i}].loss", "loss"),
            values=list(c.values),
        )
        for i, c in enumerate(channels)
    ]


def task_to_proto(task: TaskRef) -> trace_pb2.TaskRef:
    msg = trace_pb2.TaskRef(env=task.env, split=task.split, idx=task.idx, data=task.data)
    if isinstance(task.example_id, bool):
        raise WireError("task.example_id", "task.example_id must be an int or a str, not a bool")
    if isinstance(task.example_id, int):
        msg.example_id.int_value = task.example_id
    elif isinstance(task.example_id, str):
        msg.example_id.str_value = task.example_id
    return msg


def task_from_proto(msg: trace_pb2.TaskRef) -> TaskRef:
    which = msg.example_id.WhichOneof("value") if msg.HasField("example_id") else None
    example_id = getattr(msg.example_id, which) if which else None
    return TaskRef(env=msg.env, split=msg.split, idx=msg.idx, example_id=example_id, data=msg.data)


def trace_to_proto(trace: Trace) -> trace_pb2.Trace:
    return trace_pb2.Trace(
        id=trace.id,
        rollout_id=trace.rollout_id,
        group_id=trace.group_id,
        task=task_to_proto(trace.task),
        member_id=trace.member_id,
        nodes=[
            trace_pb2.MessageNode(
                id=n.id,
                parent=n.parent or "",
                role=_ROLE_TO_PB[n.role],
                content=n.content,
                token_ids=n.token_ids,
                sampled_mask=n.sampled_mask,
                logprobs=n.logprobs,
                is_observation=n.is_observation,
                parse_error=n.parse_error,
            )
            for n in trace.nodes
        ],
        branches=[
            trace_pb2.Branch(node_ids=b.node_ids, channels=channels_to_proto(b.channels), mask=b.mask)
            for b in trace.branches
        ],
        rewards={
            k: trace_pb2.RewardComponent(score=v.score, weight=v.weight) for k, v in trace.rewards.items()
        },
        reward=trace.reward,
        metrics=trace.metrics,
        errors=[
            trace_pb2.TraceError(type=e.type, message=e.message, retryable=e.retryable) for e in trace.errors
        ],
        stop_condition=STOP_TO_PB[trace.stop_condition],
        is_truncated=trace.is_truncated,
        policy_span=trace_pb2.PolicySpan(start=trace.policy_span[0], end=trace.policy_span[1]),
        timing=trace_pb2.Timing(
            **{k: trace.timing.get(k, 0.0) for k in ("setup_s", "generation_s", "scoring_s", "total_s")}
        ),
        info=trace.info,
    )


def trace_from_proto(msg: trace_pb2.Trace, where: str = "trace") -> Trace:
    nodes = [
        MessageNode(
            id=n.id,
            parent=n.parent or None,
            role=enum_from_proto(_ROLE_FROM_PB, n.role, f"{where}.nodes[{i}].role", "role"),
            content=n.content,
            token_ids=list(n.token_ids),
            sampled_mask=list(n.sampled_mask),
            logprobs=list(n.logprobs),
            is_observation=n.is_observation,
            parse_error=n.parse_error,
        )
        for i, n in enumerate(msg.nodes)
    ]
    branches = [
        Branch(
            node_ids=list(b.node_ids),
            channels=channels_from_proto(b.channels, f"{where}.branches[{i}]"),
            mask=list(b.mask),
        )
        for i, b in enumerate(msg.branches)
    ]
    trace = Trace(
        id=msg.id,
        rollout_id=msg.rollout_id,
        group_id=msg.group_id,
        task=task_from_proto(msg.task),
        member_id=msg.member_id,
        nodes=nodes,
        branches=branches,
        rewards={k: RewardComponent(v.score, v.weight) for k, v in msg.rewards.items()},
        reward=msg.reward,
        metrics=dict(msg.metrics),
        errors=[TraceError(e.type, e.message, e.retryable) for e in msg.errors],
        stop_condition=STOP_FROM_PB.get(msg.stop_condition, ""),
        is_truncated=msg.is_truncated,
        policy_span=(msg.policy_span.start, msg.policy_span.end),
        timing={
            "setup_s": msg.timing.setup_s,
            "generation_s": msg.timing.generation_s,
            "scoring_s": msg.timing.scoring_s,
            "total_s": msg.timing.total_s,
        },
        info=dict(msg.info),
    )
    trace.validate(where)
    return trace


def trace_to_json(trace: Trace) -> dict:
    """The trace in the proto's JSON mapping (camelCase keys, defaults left out)."""
    return json_format.MessageToDict(trace_to_proto(trace))
