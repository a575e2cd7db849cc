"""verifiers v1 environments in the env-server: `id = "vf:<name>"` (docs/verifiers.md).

`<name>` is a verifiers taskset id: an installed (or importable) package exporting its
`vf.Taskset` subclass through `__all__`, found the way verifiers finds it. The env-server runs
each rollout through verifiers' own machinery (`Env.run_slot`: the taskset's harness, the
interception server, the task's rewards and metrics) with verifiers' train client
(`TrainClientConfig`: the `renderers` renderer over the model's Hugging Face tokenizer folder,
generating through the replica's `POST /inference/v1/generate`), and converts each episode's
trace into rlrun's `Trace` (`convert_trace`): node for node, token for token.

The entry's `args`:
- `taskset`: the verifiers taskset config (its fields; `id` is `<name>`);
- `env`: the rest of verifiers' env config (agent harness, runtime, retries, timeouts). The
  agent's runtime defaults to `subprocess` (verifiers' own default is a Prime sandbox);
- `eval_buckets`: the eval split is the tasks whose key hashes into bucket 0 of this many
  (default 16); 0: eval is the whole taskset, as train;
- `max_tasks`: at most this many tasks are read from the taskset (default 100000);
- `reference`: a task data field holding a reference answer, for the warm start's rule target;
- `api_key_var`: the env var holding the HTTP API's key (default: the env-server's own gRPC
  token when it has one, which a service with a token also asks for on its HTTP API; else
  none sent).

verifiers is imported when a `vf:` env is built, never by the light install.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlrun.common.wire.plan import PlanTarget
from rlrun.common.wire.trace import Branch, MessageNode, RewardComponent, TaskRef, Trace, TraceError
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import POLICY, Episode
from rlrun.env_server.sdk.harnesses import SingleTurnHarness
from rlrun.env_server.sdk.task import Score, Task
from rlrun.env_server.sdk.taskset import EVAL, TRAIN, Taskset, in_eval_bucket
from rlrun.env_server.server.rollout import RolloutJob, Runtime, error_traces, policy_target, task_ref

VF_PREFIX = "vf:"
RETRYABLE_TYPES = frozenset({"InterceptionError", "SandboxError", "TunnelError", "TimeoutError"})
"""verifiers error types that are infrastructure faults (the group is worth retrying)."""
TRUNCATING_STOPS = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}
)


def _import_verifiers() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as error:
        raise ValueError(
            f"verifiers environments need the `verifiers` package: pip install 'rlrun[verifiers]' ({error})"
        ) from None
    return vf


class ListTaskset(Taskset):
    """The verifiers tasks, read once, by split."""

    def __init__(self, splits: dict[str, list[Task]]):
        self.splits = splits

    @property
    def sizes(self) -> dict[str, int]:
        return {split: len(tasks) for split, tasks in self.splits.items()}

    def get(self, split: str, idx: int) -> Task:
        if split not in self.splits:
            raise KeyError(f"unknown split {split!r}; expected one of {sorted(self.splits)}")
        tasks = self.splits[split]
        if not 0 <= idx < len(tasks):
            raise IndexError(f"{split} task {idx} is outside [0, {len(tasks)})")
        return tasks[idx]


def _prompt_text(data: Any) -> str:
    prompt = data.prompt
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    return data.prompt_text


class VerifiersEnv(Environment):
    def __init__(
        self,
        env_name: str,
        taskset: dict[str, Any] | None = None,
        env: dict[str, Any] | None = None,
        eval_buckets: int = 16,
        max_tasks: int = 100_000,
        reference: str | None = None,
        api_key_var: str = "",
    ):
        vf = _import_verifiers()
        if eval_buckets == 1 or eval_buckets < 0:
            raise ValueError(f"eval_buckets must be 0 or at least 2, got {eval_buckets}")
        self.env_name = env_name
        self.reference = reference
        self.api_key_var = api_key_var
        raw: dict[str, Any] = {**(env or {}), "taskset": {**(taskset or {}), "id": env_name}}
        agent = raw.setdefault("agent", {})
        if isinstance(agent, dict):
            agent.setdefault("runtime", {"type": "subprocess"})
        self.vf_config = vf.resolve_env_config(raw)
        self.vf_env = vf.load_environment(self.vf_config)
        self._vf_tasks: dict[str, list[Any]] = {TRAIN: [], EVAL: []}
        for vf_task in self.vf_env.taskset.take(max_tasks):
            split = EVAL if eval_buckets and in_eval_bucket(vf_task.key, eval_buckets) else TRAIN
            self._vf_tasks[split].append(vf_task)
        if not eval_buckets:
            self._vf_tasks[EVAL] = list(self._vf_tasks[TRAIN])
        self.taskset = ListTaskset(
            {
                split: [
                    Task(
                        split,
                        idx,
                        vf_task.key,
                        _prompt_text(vf_task.data),
                        vf_task.data.model_dump(mode="json"),
                        vf_task.data.system_prompt,
                    )
                    for idx, vf_task in enumerate(tasks)
                ]
                for split, tasks in self._vf_tasks.items()
            }
        )
        self.harness = SingleTurnHarness()
        """Plays only rule targets (the warm start's oracle); verifiers plays the model's turns."""
        self._serving: contextlib.AsyncExitStack | None = None
        self._models: dict[str, str] = {}

    # --- the rlrun side: rule targets (warm start) ------------------------------------------

    def score(self, task: Task, episode: Episode) -> Score:
        """Only rule-played rollouts (the reference answer, as the warm start trains it) are
        scored here; the model's rollouts are scored by the task's own rewards."""
        return Score.of("reference", 1.0)

    def reference_answer(self, task: Task) -> str:
        if not self.reference:
            raise NotImplementedError(
                f"vf:{self.env_name} has no reference answer: set args.reference to a task data field"
            )
        return str(task.data[self.reference])

    @property
    def has_reference_answer(self) -> bool:
        return bool(self.reference)

    # --- the verifiers side -----------------------------------------------------------------

    async def run_job(
        self, job: RolloutJob, runtime: Runtime, timeout_s: float, cancelled: asyncio.Event
    ) -> list[Trace] | None:
        """The job's rollouts through verifiers' `run_slot`; None for a rule target (the
        warm start's oracle answers through the rlrun harness)."""
        target = policy_target(job.plan)
        if target.model.kind == "rule":
            return None
        try:
            ctx = await self._context(target, runtime)
        except Exception as error:  # a missing HTTP address, a renderer that cannot load
            return error_traces(job, TraceError(type(error).__name__, str(error), retryable=False))
        vf_task = self._vf_tasks[job.task.split][job.task.idx]
        addresses = list(target.model.addresses)
        start = await _policy_version(runtime, addresses, min)
        await self._ensure_serving()
        slots = self.vf_env.slots(vf_task, len(job.rollout_ids))
        work = asyncio.gather(*(self.vf_env.run_slot(slot, ctx) for slot in slots))
        outcome = await _wait(work, timeout_s, cancelled)
        if outcome != "done":
            message = (
                "the orchestrator cancelled the rollout"
                if outcome == "cancelled"
                else (f"the rollout did not finish within {timeout_s:.3g} s")
            )
            kind = "Cancelled" if outcome == "cancelled" else "TimeoutError"
            stop = "cancelled" if outcome == "cancelled" else "error"
            return error_traces(job, TraceError(kind, message, retryable=outcome == "timeout"), stop)
        end = await _policy_version(runtime, addresses, max)
        ref = task_ref(job.env_key, job.task)
        traces = []
        for rollout_id, episode in zip(job.rollout_ids, work.result(), strict=True):
            trace = convert_episode(episode, rollout_id, job.group_id, ref, (start, end))
            trace.validate(f"trace[{trace.id}]")
            traces.append(trace)
        return traces

    async def _context(self, target: PlanTarget, runtime: Runtime) -> Any:
        vf = _import_verifiers()
        from renderers import DefaultRendererConfig

        if not target.model.http_addresses:
            raise ValueError(
                f"vf:{self.env_name} generates over HTTP, but the plan names no HTTP address of "
                f"{target.model.name!r} (inference.http_addresses; rlrun local sets it)"
            )
        if runtime.tokenizer_path is None:
            raise ValueError(f"vf:{self.env_name} needs the model's tokenizer folder for its renderer")
        base_url = target.model.http_addresses[0].rstrip("/")
        key_var = self.api_key_var or _run_token_var(runtime)
        model = self._models.get(base_url) or await _served_model(base_url, key_var)
        self._models[base_url] = model
        client = vf.TrainClientConfig(
            base_url=f"{base_url}/v1",
            api_key_var=key_var or "RLRUN_VF_NO_KEY",
            renderer=DefaultRendererConfig(),
            renderer_model_name=_absolute(runtime.tokenizer_path),
        )
        return vf.ModelContext(model=model, client=client, sampling=_sampling(vf, target))

    async def _ensure_serving(self) -> None:
        """verifiers' serving resources (the interception server, shared tools) live as long
        as the worker: entered on the first job."""
        if self._serving is None:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(self.vf_env.serving())
            self._serving = stack


RUN_TOKEN_VAR = "RLRUN_RUN_TOKEN"
"""Where a worker puts its gRPC token for verifiers' client, which reads its key from an env var."""


def _run_token_var(runtime: Runtime) -> str:
    """The env var holding the env-server's gRPC token (set in this worker), "" without one."""
    token = runtime.client.options.auth_token
    if token is None:
        return ""
    os.environ[RUN_TOKEN_VAR] = token
    return RUN_TOKEN_VAR


def _absolute(path: Path) -> str:
    return str(Path(path).resolve())


def _sampling(vf: Any, target: PlanTarget) -> Any:
    """The plan's sampling as verifiers' SamplingConfig (vLLM's names; the renderer sets the
    stop tokens of its chat format)."""
    s = target.sampling
    extra: dict[str, Any] = {}
    if s.top_k:
        extra["top_k"] = s.top_k
    if s.seed is not None:
        extra["seed"] = s.seed
    return vf.SamplingConfig(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, **extra)


async def _served_model(base_url: str, api_key_var: str) -> str:
    """The model id the HTTP API serves (GET /v1/models)."""
    import httpx

    headers = {"Authorization": f"Bearer {os.environ[api_key_var]}"} if api_key_var else {}
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        response = await http.get(f"{base_url}/v1/models", headers=headers)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])


async def _policy_version(runtime: Runtime, addresses: Sequence[str], pick: Any) -> int:
    """The lowest (`min`) or highest (`max`) policy version the replicas serve now. Read before
    the first and after the last model call, it bounds every sampled token's version: a replica
    serves one version at a time, and versions only grow."""
    versions = [(await runtime.client.status(address)).policy_version for address in addresses]
    return int(pick(versions))


async def _wait(work: asyncio.Future, timeout_s: float, cancelled: asyncio.Event) -> str:
    cancel_wait = asyncio.ensure_future(cancelled.wait())
    try:
        done, _ = await asyncio.wait(
            {work, cancel_wait}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        cancel_wait.cancel()
    if work in done:
        work.result()
        return "done"
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return "cancelled" if cancelled.is_set() else "timeout"


# --- trace conversion ------------------------------------------------------------------------


def convert_episode(
    episode: Any, rollout_id: str, group_id: str, ref: TaskRef, policy_span: tuple[int, int]
) -> Trace:
    """One verifiers episode as one rlrun trace: its one trainable trace converted, or a trace
    with errors (the episode failed, or it holds no or several trainable traces)."""
    trainable = [t for t in episode.traces if t.agent.trainable]
    problem: TraceError | None = None
    if episode.errors and not trainable:
        problem = _error(episode.errors[-1])
    elif len(trainable) != 1:
        problem = TraceError(
            "UnsupportedEpisode",
            f"the verifiers episode has {len(trainable)} trainable traces; rlrun maps exactly one "
            "per rollout (multi-agent verifiers envs are not supported yet)",
        )
    if problem is not None:
        return Trace(
            id=rollout_id,
            task=ref,
            rollout_id=rollout_id,
            group_id=group_id,
            member_id=POLICY,
            errors=[problem],
            stop_condition="error",
        )
    trace = convert_trace(trainable[0], rollout_id, group_id, ref, policy_span)
    if episode.errors and not trace.errors:
        trace.errors = [_error(episode.errors[-1])]
        trace.stop_condition = "error"
    return trace


def convert_trace(
    vf_trace: Any, rollout_id: str, group_id: str, ref: TaskRef, policy_span: tuple[int, int]
) -> Trace:
    """A verifiers trace as rlrun's: node i becomes node `n<i>` with the same parent, role,
    token ids, sampled mask and logprobs (so every branch's concatenation is the exact sequence
    the model saw, each sampled token with the logprob it was drawn with); the trainable
    branches in order; the rewards (name: score, weight), their weighted sum, the metrics."""
    nodes = convert_nodes(vf_trace)
    trace = Trace(
        id=rollout_id,
        task=ref,
        nodes=nodes,
        branches=[Branch(node_ids=_branch_ids(vf_trace, b)) for b in vf_trace.branches if b.trainable],
        rollout_id=rollout_id,
        group_id=group_id,
        member_id=POLICY,
        is_truncated=bool(vf_trace.is_truncated),
        policy_span=policy_span,
        info=_info(vf_trace),
    )
    trace.metrics = {
        "completion_tokens": float(sum(n.num_sampled for n in nodes)),
        "assistant_turns": float(sum(n.role == "assistant" for n in nodes)),
        **{name: float(v) for name, v in vf_trace.metrics.items() if v is not None and math.isfinite(v)},
    }
    if vf_trace.errors or not vf_trace.ok:
        error = (
            _error(vf_trace.errors[-1])
            if vf_trace.errors
            else TraceError(
                "VerifiersError", f"the verifiers trace did not complete ({vf_trace.stop_condition})"
            )
        )
        trace.errors, trace.stop_condition = [error], "error"
        return trace
    trace.rewards = {
        name: RewardComponent(float(r.score), float(r.weight))
        for name, r in vf_trace.rewards.items()
        if r is not None
    }
    trace.reward = sum(c.score * c.weight for c in trace.rewards.values())
    trace.stop_condition = "length" if trace.is_truncated else "completed"
    if vf_trace.stop_condition == "max_turns":
        trace.stop_condition = "max_turns"
    return trace


def _branch_ids(vf_trace: Any, branch: Any) -> list[str]:
    index = {id(node): i for i, node in enumerate(vf_trace.nodes)}
    return [f"n{index[id(node)]}" for node in branch.nodes]


def convert_nodes(vf_trace: Any) -> list[MessageNode]:
    """The message graph, node for node. A user or tool message after a model turn on its path
    is an observation (what the environment returned)."""
    nodes: list[MessageNode] = []
    answered: list[bool] = []
    """Per node: whether a model turn is on its path (itself included)."""
    for i, node in enumerate(vf_trace.nodes):
        role = node.message.role
        after_model = node.parent is not None and answered[node.parent]
        if node.sampled and not node.token_ids:
            raise ValueError(f"node {i}: a sampled message without token ids (not a train client's trace)")
        nodes.append(
            MessageNode(
                id=f"n{i}",
                role=role,
                token_ids=list(node.token_ids),
                sampled_mask=[bool(m) for m in node.mask] if node.mask else [False] * len(node.token_ids),
                logprobs=[float(lp) for lp in node.logprobs],
                parent=None if node.parent is None else f"n{node.parent}",
                content=_content(node.message),
                is_observation=role in ("user", "tool") and not node.sampled and after_model,
            )
        )
        answered.append(after_model or (node.sampled and role == "assistant"))
    return nodes


def _content(message: Any) -> str:
    from verifiers.v1.types import content_text

    text = content_text(message.content) if message.content is not None else ""
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        text += "".join(
            "\n" + json.dumps({"name": c.name, "arguments": c.arguments}, separators=(",", ":"))
            for c in calls
        )
    return text


def _info(vf_trace: Any) -> dict[str, str]:
    return {
        "verifiers_trace_id": str(vf_trace.id),
        "verifiers_stop_condition": str(vf_trace.stop_condition or ""),
        "verifiers_agent": str(vf_trace.agent.name),
    }


def _error(error: Any) -> TraceError:
    status = getattr(error, "status_code", None)
    retryable = error.type in RETRYABLE_TYPES or (
        error.type == "ProviderError" and (status is None or status == 429 or status >= 500)
    )
    return TraceError(error.type, error.message, retryable=retryable)
