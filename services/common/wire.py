"""The one place where proto messages become in-process types and back.

Every `*_from_proto` validates what it builds and raises WireError naming the field;
servers turn that into INVALID_ARGUMENT. Malformed messages never get further.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rlrun.common.types import (
    Branch,
    Channel,
    GenerationPlan,
    MessageNode,
    ModelEndpoint,
    PlanTarget,
    RewardComponent,
    SamplingParams,
    TaskRef,
    Trace,
    TraceError,
    TrainingBatch,
    TrainingSample,
    WireError,
)
from rlrun.v1 import env_pb2, plan_pb2, sampling_pb2, trace_pb2, training_pb2

_ROLE_TO_PB = {
    "system": trace_pb2.ROLE_SYSTEM,
    "user": trace_pb2.ROLE_USER,
    "assistant": trace_pb2.ROLE_ASSISTANT,
    "tool": trace_pb2.ROLE_TOOL,
}
_ROLE_FROM_PB = {v: k for k, v in _ROLE_TO_PB.items()}
_LOSS_TO_PB = {"rl": trace_pb2.LOSS_TYPE_RL, "ce": trace_pb2.LOSS_TYPE_CE}
_LOSS_FROM_PB = {v: k for k, v in _LOSS_TO_PB.items()}
_STOP_TO_PB = {
    "": trace_pb2.STOP_CONDITION_UNSPECIFIED,
    "completed": trace_pb2.STOP_CONDITION_COMPLETED,
    "length": trace_pb2.STOP_CONDITION_LENGTH,
    "max_turns": trace_pb2.STOP_CONDITION_MAX_TURNS,
    "error": trace_pb2.STOP_CONDITION_ERROR,
    "cancelled": trace_pb2.STOP_CONDITION_CANCELLED,
}
_STOP_FROM_PB = {v: k for k, v in _STOP_TO_PB.items()}
_MEMBER_ROLE_TO_PB = {"train": plan_pb2.MEMBER_ROLE_TRAIN, "fixed": plan_pb2.MEMBER_ROLE_FIXED}
_MEMBER_ROLE_FROM_PB = {v: k for k, v in _MEMBER_ROLE_TO_PB.items()}
_KIND_TO_PB = {
    "inference": plan_pb2.ENDPOINT_KIND_INFERENCE,
    "rule": plan_pb2.ENDPOINT_KIND_RULE,
    "openai": plan_pb2.ENDPOINT_KIND_OPENAI,
}
_OPENAI_FIELDS = ("base_url", "model", "api_key_env", "max_concurrency", "max_retries", "timeout_s")
"""ModelEndpoint's fields of kind openai: the same names in the proto and in types.ModelEndpoint."""
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}


def _enum(table: dict, value: int, where: str, name: str):
    try:
        return table[value]
    except KeyError:
        raise WireError(where, f"{where} has an unknown or unspecified {name} ({value})") from None


# ---- sampling -------------------------------------------------------------------------


def sampling_to_proto(params: SamplingParams) -> sampling_pb2.SamplingParams:
    msg = sampling_pb2.SamplingParams(
        temperature=params.temperature,
        max_tokens=params.max_tokens,
        stop_token_ids=params.stop_token_ids,
        n=params.n,
    )
    if params.top_p != 1.0:
        msg.top_p = params.top_p
    if params.top_k:
        msg.top_k = params.top_k
    if params.seed is not None:
        msg.seed = params.seed
    return msg


def sampling_from_proto(
    msg: sampling_pb2.SamplingParams,
    where: str = "sampling",
    *,
    vocab_size: int | None = None,
    max_model_len: int | None = None,
    prompt_len: int | None = None,
    max_samples: int | None = None,
) -> SamplingParams:
    params = SamplingParams(
        temperature=msg.temperature,
        top_p=msg.top_p if msg.HasField("top_p") else 1.0,
        top_k=msg.top_k if msg.HasField("top_k") else 0,
        max_tokens=msg.max_tokens,
        stop_token_ids=list(msg.stop_token_ids),
        seed=msg.seed if msg.HasField("seed") else None,
        n=msg.n or 1,
    )
    params.validate(
        where,
        vocab_size=vocab_size,
        max_model_len=max_model_len,
        prompt_len=prompt_len,
        max_samples=max_samples,
    )
    return params


# ---- traces ---------------------------------------------------------------------------


def _channels_to_proto(channels: list[Channel]) -> list[trace_pb2.AdvantageChannel]:
    return [trace_pb2.AdvantageChannel(loss=_LOSS_TO_PB[c.loss], values=c.values) for c in channels]


def channels_from_proto(channels, where: str) -> list[Channel]:
    return [
        Channel(
            loss=_enum(_LOSS_FROM_PB, c.loss, f"{where}.channels[{i}].loss", "loss"), values=list(c.values)
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
            trace_pb2.Branch(node_ids=b.node_ids, channels=_channels_to_proto(b.channels), mask=b.mask)
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
        stop_condition=_STOP_TO_PB[trace.stop_condition],
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
            role=_enum(_ROLE_FROM_PB, n.role, f"{where}.nodes[{i}].role", "role"),
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
        stop_condition=_STOP_FROM_PB.get(msg.stop_condition, ""),
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


def group_from_proto(
    msgs: Sequence[trace_pb2.Trace],
    request: env_pb2.RunGroupRequest,
    where: str,
    reward_range: env_pb2.RewardRange | None = None,
) -> list[Trace]:
    """The traces of a RunGroup reply, checked against the request (env.proto's
    RunGroupResponse): n traces per plan target, the group and the task echoed, a member id
    that names a target, branches and a policy span on every trace without errors, each
    trace's own invariants, and rewards within the env's declared range."""
    members = [t.member_id for t in request.plan.targets]
    counts: Counter[str] = Counter()
    traces = []
    for i, msg in enumerate(msgs):
        at = f"{where}.traces[{i}]"
        if msg.group_id != request.group_id:
            raise WireError(
                f"{at}.group_id", f"{at}.group_id {msg.group_id!r} is not the requested {request.group_id!r}"
            )
        for name in ("env", "split", "idx"):
            got, asked = getattr(msg.task, name), getattr(request.task, name)
            if got != asked:
                raise WireError(
                    f"{at}.task.{name}", f"{at}.task.{name} {got!r} is not the requested {asked!r}"
                )
        if msg.member_id not in members:
            raise WireError(
                f"{at}.member_id",
                f"{at}.member_id {msg.member_id!r} names no plan target (targets: {', '.join(members)})",
            )
        if not msg.errors:
            if not msg.branches:
                raise WireError(
                    f"{at}.branches",
                    f"{at}.branches is empty: a trace without errors needs a branch (node ids, root to leaf) to train on",
                )
            if not msg.HasField("policy_span"):
                raise WireError(
                    f"{at}.policy_span",
                    f"{at}.policy_span is unset: a trace without errors needs the policy versions "
                    "of its sampled tokens ({0, 0} without a model call)",
                )
        trace = trace_from_proto(msg, at)
        if reward_range is not None and not reward_range.min <= trace.reward <= reward_range.max:
            raise WireError(
                f"{at}.reward",
                f"{at}.reward {trace.reward} is outside the env's reward_range "
                f"[{reward_range.min}, {reward_range.max}]",
            )
        counts[msg.member_id] += 1
        traces.append(trace)
    for member in members:
        if counts[member] != request.n:
            raise WireError(
                f"{where}.traces",
                f"{where}.traces has {counts[member]} traces of member {member!r} for n = {request.n} rollouts",
            )
    return traces


# ---- training -------------------------------------------------------------------------


def sample_to_proto(sample: TrainingSample) -> training_pb2.TrainingSample:
    return training_pb2.TrainingSample(
        token_ids=sample.token_ids,
        mask=sample.mask,
        logprobs=sample.logprobs,
        temperatures=sample.temperatures,
        channels=_channels_to_proto(sample.channels),
    )


def batch_to_proto(batch: TrainingBatch) -> training_pb2.TrainingBatch:
    msg = training_pb2.TrainingBatch(
        step=batch.step,
        policy_version=batch.policy_version,
        samples=[sample_to_proto(s) for s in batch.samples],
        metrics=batch.metrics,
    )
    if batch.learning_rate is not None:
        msg.learning_rate = batch.learning_rate
    return msg


def batch_from_proto(
    msg: training_pb2.TrainingBatch, where: str = "batch", vocab_size: int | None = None
) -> TrainingBatch:
    samples = [
        TrainingSample(
            token_ids=list(s.token_ids),
            mask=list(s.mask),
            logprobs=list(s.logprobs),
            temperatures=list(s.temperatures),
            channels=channels_from_proto(s.channels, f"{where}.samples[{i}]"),
        )
        for i, s in enumerate(msg.samples)
    ]
    batch = TrainingBatch(
        step=msg.step,
        policy_version=msg.policy_version,
        samples=samples,
        metrics=dict(msg.metrics),
        learning_rate=msg.learning_rate if msg.HasField("learning_rate") else None,
    )
    batch.validate(where, vocab_size)
    return batch


# ---- plan -----------------------------------------------------------------------------


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
            role=_enum(_MEMBER_ROLE_FROM_PB, t.role, f"{at}.role", "member role"),
            model=ModelEndpoint(
                name=t.model.name,
                kind=_enum(_KIND_FROM_PB, t.model.kind, f"{at}.model.kind", "endpoint kind"),
                addresses=list(t.model.addresses),
                http_addresses=list(t.model.http_addresses),
                **{name: getattr(t.model, name) for name in _OPENAI_FIELDS},
            ),
            sampling=sampling_from_proto(t.sampling, f"{at}.sampling"),
        )
    plan = GenerationPlan(targets)
    plan.validate(where)
    return plan
