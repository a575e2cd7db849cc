"""Runs the rollouts of one request (RunRollout: one; RunGroup: n) and turns the episodes into
validated traces: one per rollout, or for a multi-agent env one per member of every rollout
(id `<rollout id>/<member>`). Everything that goes wrong inside a rollout ends up in the
traces' `errors`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from rlrun.common.tokenizer import Tokenizer
from rlrun.common.wire.plan import GenerationPlan, PlanTarget
from rlrun.common.wire.trace import TaskRef, Trace, TraceError
from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import POLICY, Episode
from rlrun.env_server.sdk.errors import ScoringError, trace_error
from rlrun.env_server.sdk.inference_client import InferenceClient
from rlrun.env_server.sdk.models import (
    InferenceModel,
    Model,
    OpenAIModel,
    RuleModel,
    RulePlayer,
)
from rlrun.env_server.sdk.multi_agent import MultiAgentEpisode
from rlrun.env_server.sdk.openai_client import OpenAIClients
from rlrun.env_server.sdk.sandbox import close_sandboxes
from rlrun.env_server.sdk.task import MemberScores, Score, Task

log = logging.getLogger("rlrun.env_server.rollout")

CANCELLED = TraceError("Cancelled", "the orchestrator cancelled the rollout", retryable=False)


@dataclass
class RolloutJob:
    """The validated content of a RunRollout (one id) or RunGroup (n ids) request."""

    env_key: str
    task: Task
    plan: GenerationPlan
    group_id: str
    rollout_ids: list[str]


@dataclass
class Runtime:
    """What rollouts need besides the environment, shared by all jobs of a worker."""

    tokenizer: Tokenizer
    client: InferenceClient
    max_model_len: int
    openai: OpenAIClients = field(default_factory=OpenAIClients)
    """Clients of the plan's openai-kind targets, one per endpoint (each with its concurrency cap)."""
    tokenizer_path: Path | None = None
    """The folder `tokenizer` was loaded from (model.tokenizer, else the checkpoint's), for envs
    that load it themselves (a verifiers env's renderer)."""


def task_ref(env_key: str, task: Task) -> TaskRef:
    return TaskRef(
        env=env_key,
        split=task.split,
        idx=task.idx,
        example_id=task.example_id,
        data=json.dumps(task.data, separators=(",", ":"), sort_keys=True),
    )


def policy_target(plan: GenerationPlan) -> PlanTarget:
    """The one target of a single-agent plan (`policy`, or e.g. the warm start's `oracle`)."""
    if len(plan.targets) != 1:
        raise ValueError(f"a single-agent env needs a plan with one target, got {sorted(plan.targets)}")
    return next(iter(plan.targets.values()))


def inference_model(target: PlanTarget, runtime: Runtime, request_id: str) -> InferenceModel:
    # A compiled plan holds them already (the orchestrator's plan compiler); a plan from
    # another client may not: an assistant message ends at the chat format's end either way.
    sampling = target.sampling.with_stop_tokens(runtime.tokenizer.stop_token_ids)
    return InferenceModel(runtime.client, target.model.addresses, sampling, runtime.max_model_len, request_id)


def openai_model(target: PlanTarget, runtime: Runtime, conversation: Conversation) -> OpenAIModel:
    """An openai-kind target speaking in `conversation` (it sends that conversation's messages)."""
    return OpenAIModel(
        runtime.openai.get(target.model), runtime.tokenizer, conversation.messages, target.sampling
    )


def build_model(env: Environment, task: Task, target: PlanTarget, runtime: Runtime, request_id: str) -> Model:
    if target.model.kind == "rule":
        return RuleModel(runtime.tokenizer, env.reference_answer(task), target.sampling.max_tokens)
    return inference_model(target, runtime, request_id)


def trace_id(rollout_id: str, member: str, multi_agent: bool) -> str:
    return f"{rollout_id}/{member}" if multi_agent else rollout_id


def error_traces(
    job: RolloutJob, error: TraceError, stop: str = "error", members: tuple[str, ...] = ()
) -> list[Trace]:
    """Traces without messages for rollouts that never ran (e.g. their worker died): one per
    rollout, or one per member of every rollout for a multi-agent env (`members`)."""
    ref = task_ref(job.env_key, job.task)
    return [
        Trace(
            id=trace_id(rid, member, bool(members)),
            task=ref,
            rollout_id=rid,
            group_id=job.group_id,
            member_id=member,
            errors=[error],
            stop_condition=stop,
        )
        for rid in job.rollout_ids
        for member in members or (POLICY,)
    ]  # type: ignore[arg-type]


def start_episodes(env: Environment, job: RolloutJob, runtime: Runtime) -> list[Episode]:
    """One episode per rollout id, each member's conversation opened with its prompt. Inference
    models are shared by a group's episodes (one call per turn, seeds advance per call); rule
    players of a multi-agent env answer from their own episode."""
    request_id = job.group_id or job.rollout_ids[0]
    if not env.members:
        target = policy_target(job.plan)
        model = (
            None if target.model.kind == "openai" else build_model(env, job.task, target, runtime, request_id)
        )
        episodes: list[Episode] = []
        for _ in job.rollout_ids:
            conversation = Conversation(runtime.tokenizer)
            conversation.add_prompt(job.task.prompt, job.task.system)
            own = model or openai_model(target, runtime, conversation)
            episodes.append(Episode(job.task, {POLICY: conversation}, {POLICY: own}))
        return episodes
    targets = {member: job.plan.targets[member] for member in env.members}
    shared: dict[str, Model] = {
        member: inference_model(target, runtime, f"{request_id}:{member}")
        for member, target in targets.items()
        if target.model.kind == "inference"
    }
    roles = {member: target.role for member, target in targets.items()}
    episodes = []
    for index in range(len(job.rollout_ids)):
        conversations = {}
        for member in targets:
            conversations[member] = Conversation(runtime.tokenizer)
            conversations[member].add_prompt(*env.member_prompt(job.task, member))
        episode = MultiAgentEpisode(job.task, conversations, dict(shared), roles, index)
        for member, target in targets.items():
            if target.model.kind == "rule":
                reply = partial(env.rule_reply, job.task, episode, member, target)
                episode.models[member] = RulePlayer(runtime.tokenizer, reply, target.sampling.max_tokens)
            elif target.model.kind == "openai":
                episode.models[member] = openai_model(target, runtime, conversations[member])
        episodes.append(episode)
    return episodes


async def _drive(work: asyncio.Future, timeout_s: float, cancelled: asyncio.Event) -> str:
    """Waits for `work`; returns `done`, `timeout` or `cancelled` (and then cancels `work`).
    Cancelled itself (the job was abandoned), it cancels `work` too."""
    cancel_wait = asyncio.ensure_future(cancelled.wait())
    try:
        done, _ = await asyncio.wait(
            {work, cancel_wait}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        cancel_wait.cancel()
    if work in done:
        work.result()
        return "done"
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return "cancelled" if cancelled.is_set() else "timeout"


def _score(
    env: Environment, task: Task, episodes: list[Episode]
) -> tuple[dict[int, Score | MemberScores], float]:
    """Scores of the episodes that finished (not failed, not cancelled), by position; a failing
    scorer, or one whose scores break the contract, fails the episodes it was scoring."""
    started = time.perf_counter()
    finished = [i for i, e in enumerate(episodes) if e.error is None and e.stop != "cancelled"]
    scores: dict[int, Score | MemberScores] = {}
    if finished and env.group_scoring:
        try:
            group = env.score_group(task, [episodes[i] for i in finished])
            if len(group) != len(finished):
                raise ValueError(f"score_group returned {len(group)} scores for {len(finished)} episodes")
            scores = dict(zip(finished, group, strict=True))
        except Exception as error:
            for i in finished:
                episodes[i].fail(_scoring_error(error))
    else:
        for i in finished:
            try:
                scores[i] = env.score(task, episodes[i])
            except Exception as error:
                episodes[i].fail(_scoring_error(error))
    for i, score in list(scores.items()):
        try:
            _check_score(env, score)
        except (TypeError, ValueError) as error:
            episodes[i].fail(_scoring_error(error))
            del scores[i]
    return scores, time.perf_counter() - started


def _check_score(env: Environment, score: Score | MemberScores) -> None:
    """A Score for a single-agent env; MemberScores covering exactly the members of a
    multi-agent env; finite numbers."""
    expected = MemberScores if env.members else Score
    if not isinstance(score, expected):
        raise TypeError(f"the scorer returned a {type(score).__name__}, expected a {expected.__name__}")
    if isinstance(score, MemberScores):
        score.check_members(env.members)
    each = list(score.scores.values()) if isinstance(score, MemberScores) else [score]
    for member_score in each:
        numbers = [v for c in member_score.rewards.values() for v in (c.score, c.weight)]
        if not all(math.isfinite(v) for v in numbers + list(member_score.metrics.values())):
            raise ValueError(f"not finite: rewards {member_score.rewards}, metrics {member_score.metrics}")


def _scoring_error(error: Exception) -> ScoringError:
    wrapped = ScoringError("the scorer raised")
    wrapped.__cause__ = error
    return wrapped


async def run_rollouts(
    env: Environment, job: RolloutJob, runtime: Runtime, timeout_s: float, cancelled: asyncio.Event
) -> list[Trace]:
    """Runs the job's rollouts through the env's harness (as one group), scores them and
    returns the validated traces in the order of `job.rollout_ids` (a multi-agent rollout's
    traces in the order of the env's members). An env with rollout machinery of its own (a
    verifiers env) runs the job in its `run_job` instead, unless that returns None."""
    own = await env.run_job(job, runtime, timeout_s, cancelled)
    if own is not None:
        return own
    started = time.perf_counter()
    try:
        episodes = start_episodes(env, job, runtime)
    except Exception as error:
        log.exception(
            "env %s: cannot start rollouts of %s task %d",
            job.env_key,
            job.task.split,
            job.task.idx,
            extra={"split": job.task.split},
        )
        return error_traces(job, trace_error(error), members=env.members)

    setup = {"s": time.perf_counter() - started}

    async def drive() -> None:
        began = time.perf_counter()
        try:
            await env.harness.setup(episodes)
        finally:
            setup["s"] += time.perf_counter() - began
        await env.harness.run_group(episodes)

    outcome = "done"
    try:
        outcome = await _drive(asyncio.ensure_future(drive()), timeout_s, cancelled)
    except Exception as error:
        for episode in episodes:
            if not episode.done:
                episode.fail(error)
    finally:  # also when the job is abandoned (cancelled): no sandbox outlives its rollout
        close_sandboxes([episode.sandbox for episode in episodes])
    for episode in episodes:
        if episode.done:
            continue
        if outcome == "cancelled":
            episode.finish("cancelled")
        elif outcome == "timeout":
            episode.fail(TimeoutError(f"the rollout did not finish within {timeout_s:.3g} s"))
        else:
            episode.finish("completed")
    scores, scoring_s = _score(env, job.task, episodes)
    ref = task_ref(job.env_key, job.task)
    traces = []
    total_s = time.perf_counter() - started
    for i, (rollout_id, episode) in enumerate(zip(job.rollout_ids, episodes, strict=True)):
        for trace in _traces(rollout_id, job, ref, episode, scores.get(i)):
            trace.timing = {
                "setup_s": setup["s"],
                "generation_s": episode.generation_s,
                "scoring_s": scoring_s,
                "total_s": total_s,
            }
            trace.validate(f"trace[{trace.id}]")
            traces.append(trace)
        if episode.error is not None and traces[-1].errors[0].type in ("HarnessError", "ScoringError"):
            log.error(
                "env %s rollout %s failed: %s",
                job.env_key,
                rollout_id,
                traces[-1].errors[0].message,
                exc_info=episode.error,
                extra={"split": job.task.split},
            )
    return traces


def _traces(
    rollout_id: str, job: RolloutJob, ref: TaskRef, episode: Episode, score: Score | MemberScores | None
) -> list[Trace]:
    """One trace per member of the episode (the one member `policy` of a single-agent episode)."""
    multi_agent = isinstance(episode, MultiAgentEpisode)
    return [
        _trace(
            trace_id(rollout_id, member, multi_agent),
            rollout_id,
            member,
            job,
            ref,
            episode,
            score.scores[member] if isinstance(score, MemberScores) else score,
        )
        for member in episode.conversations
    ]


def _trace(
    trace_id: str,
    rollout_id: str,
    member: str,
    job: RolloutJob,
    ref: TaskRef,
    episode: Episode,
    score: Score | None,
) -> Trace:
    conversation = episode.conversations[member]
    nodes = conversation.graph.nodes
    metrics = {
        "completion_tokens": float(sum(n.num_sampled for n in nodes)),
        "assistant_turns": float(sum(n.role == "assistant" for n in nodes)),
        **episode.metrics,
    }
    trace = Trace(
        id=trace_id,
        task=ref,
        nodes=nodes,
        branches=conversation.graph.branches(),
        rollout_id=rollout_id,
        group_id=job.group_id,
        member_id=member,
        is_truncated=conversation.truncated,
        policy_span=conversation.policy_span,
        metrics=metrics,
        info=dict(episode.info),
    )
    if episode.stop == "cancelled":
        trace.stop_condition, trace.errors = "cancelled", [CANCELLED]
    elif episode.error is not None:
        trace.stop_condition, trace.errors = "error", [trace_error(episode.error)]
    else:
        assert score is not None
        trace.stop_condition = episode.stop
        trace.rewards, trace.reward = score.rewards, score.reward
        trace.metrics.update(score.metrics)
    return trace
